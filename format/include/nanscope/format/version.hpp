#pragma once
// Schema identity shared by every nanscope file (docs/format.md).
#include <optional>
#include <string>
namespace nanscope::format {

// Readers accept any minor version of a major they know and reject a newer
// major. The minor version grows with the schema, and readers branch on it
// (docs/format.md, "Versions"):
//   1.0  the first schema
//   1.1  run files: events `remedy` and `save_refused`; checkpoints: @finite,
//        @loss, /training@applied_steps and @fp32_modules; snapshots: the
//        config's `fp32_modules`
//   1.2  run files and snapshots: @origin; births: /rows (the batch rows an
//        internal birth made non-finite); snapshot /batch/rows may hold -1 (unknown)
//   1.3  births: @micro_batch; snapshots: a nested batch (/batch/leaves,
//        @structure) and /batch@row_dim
//   1.4  captures: @compiled_only and @compiled_region (a compiled model's
//        step finite eagerly, non-finite compiled); run files: event `doom`
//   1.5  snapshots: /other_modules (other models' tensors the loss ran)
//   1.6  captured ops: @site (a gradient hook's op, or a recomputation's)
//   1.7  checkpoints: /training@lr_multiplier, the guard's whole LR cut
//        (was @rollback_lr_multiplier, the rollbacks' part alone)
//   1.8  births: @input (the named batch tensor an input birth is in)
//   1.9  captures: @nonfinite_weights (the parameters that held a NaN/Inf as
//        the step began, a name per line; no re-run was made)
//   1.10 captures: @discarded (births before the one reported whose values
//        every later op discarded, and batch leaves the step never read)
//   1.11 run files: event `empty_loss` (micro-batches whose non-finite loss
//        had exactly zero gradients, left out of an update that went on)
//   1.12 run files: /overview (per block of 64, 4,096 and 262,144 rows, each
//        series' min, max, last value and NaN/Inf counts: run_overview.hpp)
//   1.13 snapshots: /replay/precision_trail (a precision verdict's ops
//        compared with fp32 up to the birth: precision_trail.hpp)
//   1.14 snapshots: /replay@kernel_op and @kernel_trials (the step re-run
//        with the born op's other kernels: kernel_trials.hpp); verdict `kernel`
inline constexpr int kFormatMajor = 1;
inline constexpr int kFormatMinor = 14;

// A file's format_version, as its readers branch on it.
struct FileVersion {
  int major = kFormatMajor, minor = kFormatMinor;
  bool at_least(int major_version, int minor_version) const {
    return major > major_version || (major == major_version && minor >= minor_version);
  }
};
// "1.1" -> {1, 1}; nullopt for anything else.
std::optional<FileVersion> parse_file_version(const std::string& text);

// The root attribute `format` says which kind of nanscope file this is.
inline constexpr const char* kRunFileKind = "nanscope-run";
inline constexpr const char* kSnapshotFileKind = "nanscope-snapshot";
inline constexpr const char* kCheckpointFileKind = "nanscope-checkpoint";

// The kind of a nanscope file (one of the k*FileKind above), for readers that
// take any of them (the viewer). Throws FormatError naming the file when it is
// missing, not HDF5, not a nanscope file, or of a newer major version.
std::string file_kind(const std::string& path);

}  // namespace nanscope::format
