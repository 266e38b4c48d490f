#pragma once
// The exit codes every nanscope program uses (nanscope-train, nanscope-replay,
// nanscope-view, a replay program of your own), named once.
namespace nanscope {

inline constexpr int kExitOk = 0;             // done: a run, a verdict, a window closed
inline constexpr int kExitFailed = 1;         // the work itself failed (training, the replay, a screenshot)
inline constexpr int kExitBadInput = 2;       // bad arguments or input: a missing, corrupt or foreign file
inline constexpr int kExitPeerLost = 3;       // nanscope-train: another rank died or a collective timed out
inline constexpr int kExitDeadRun = 4;        // nanscope-train: nothing could save the run (its state non-finite, or
                                              // non-finite step after step with nothing left to try); it stopped
inline constexpr int kExitInterrupted = 130;  // nanscope-train: stopped by Ctrl-C, the run file whole

}  // namespace nanscope
