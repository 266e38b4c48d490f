#pragma once
// Where a test program finds the built programs, the interpreter and the data
// in the source tree. CMake writes the values into one small source file per
// test program (nanscope_test_paths in cmake/TestPaths.cmake); a program
// defines only the paths it names there.
//
// They are not -D macros because a path compiled into a test source makes its
// object differ in every clone of the repository: ccache could then reuse
// nothing of a fresh clone's LibTorch-heavy test batches, the longest part of
// its build. Only the generated file differs from clone to clone.
namespace nanscope::test::paths {

extern const char* const train_exe;      // nanscope-train
extern const char* const replay_exe;     // nanscope-replay
extern const char* const report_exe;     // nanscope-report
extern const char* const view_exe;       // nanscope-view
extern const char* const slow_fwrite;    // the LD_PRELOAD library that makes a disk slow
extern const char* const python;         // Debian's /usr/bin/python3
extern const char* const xvfb_run;       // xvfb-run, or "" where it is not installed
extern const char* const fixtures;       // tests/fixtures
extern const char* const fuzz_crashers;  // tests/fuzz/crashers
extern const char* const samples;        // samples/
extern const char* const scripts;        // scripts/

}  // namespace nanscope::test::paths
