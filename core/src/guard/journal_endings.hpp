#pragma once
// The open journals of the process, for the ways a C++ program ends without
// their destructors (journal_endings.cpp). Core-private.
#include <string>

namespace nanscope {

class Journal;

void register_journal(Journal* journal);
void unregister_journal(Journal* journal);
// How many open journals steer a model of this name.
int open_journals_named(const std::string& model_name);
// At a step's boundary: a Ctrl-C held since ends the process now, the rows written.
void end_if_interrupted();

}  // namespace nanscope
