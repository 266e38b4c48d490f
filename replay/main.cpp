// nanscope-replay: the command line of replay/cli.cpp, with the models nanscope
// rebuilds by itself (built-in and TorchScript).
#include "nanscope/replay/model_registry.hpp"

int main(int argc, char** argv) { return nanscope::replay::replay_main(argc, argv); }
