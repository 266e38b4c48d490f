#pragma once
// The precision trail (docs/replay.md): a step that is finite in fp32 and not
// at its low precision, run both ways op by op up to its first birth, and each
// op's error against fp32. Where the low-precision run first leaves fp32 by
// more than the type's rounding explains is where precision was lost, which
// may be ops before the birth (a subtraction that cancels, and the division by
// its result that makes the Inf). Stored in a replayed snapshot as
// /replay/precision_trail (docs/format.md).
#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/format/archive.hpp"
#include "nanscope/format/capture.hpp"

namespace nanscope::format {

// One op of the low-precision run and how far its first floating output was
// from the same op's in fp32. Positions non-finite in fp32 are not compared.
struct OpError {
  OpRecord op;         // as the low-precision run recorded it (no output stats)
  double max_abs = 0;  // the largest |low - fp32| over positions finite in both
  // The largest |low - fp32| / |fp32| there, over positions whose fp32 value
  // is at least one ulp (below): smaller ones are rounding noise at the op's
  // scale, and a zero has no relative error.
  double max_rel = 0;
  // max_abs in units in the last place of the low type at the op's largest
  // |fp32| value: the error against the op's own scale. Infinite where the
  // low output holds a NaN/Inf at a position finite in fp32.
  double ulps = 0;
  int64_t nonfinite = 0;  // positions non-finite at low precision and finite in fp32
};

// Rounding to the low type costs half an ulp per op and ordinary steps carry
// a few ulps of their inputs' rounding on; an op past this many ulps of its
// own scale has left the fp32 run: 4 of bfloat16's 8 significant bits gone.
inline constexpr double kPrecisionLostUlps = 16;

struct PrecisionTrail {
  std::string type;  // the low-precision type the errors are counted in: "bfloat16", "float16"
  double margin_ulps = kPrecisionLostUlps;
  std::vector<OpError> ops;  // execution order, the birth's op last
  int64_t first_lost = -1;   // the first of `ops` past margin_ulps (an index into ops), -1: none
  // Ops of the low-precision run with no fp32 counterpart (the casts autocast
  // or the model adds), left out of `ops`.
  int64_t unmatched = 0;
  std::string cut_short;  // why the trail stops before the birth, "" when it reaches it
};

// The index into trail.ops of the first op past the margin, or -1.
int64_t first_precision_loss(const std::vector<OpError>& ops, double margin_ulps);

// "aten::sub in module 'blocks.0.ln1' (forward): 128 ulps of bfloat16 from
// fp32 (max abs 1, max rel 1); the 12 ops before it stay within 16 ulps", or
// why no op was found.
std::string precision_lost_text(const PrecisionTrail& trail);
// One op's row in a table: "aten::sub  blocks.0.ln1  forward  128 ulps  max abs 1  max rel 1".
std::string op_error_text(const OpError& e);
// The rows a person reads first: up to `before` ops ahead of the first lost
// one, then from it on, up to `rows` in all, with the birth's op always last.
// Indices into trail.ops, in order.
std::vector<size_t> trail_rows_to_show(const PrecisionTrail& trail, size_t before = 3, size_t rows = 10);

// Written as a group of columns; read back, a malformed one is a FormatError naming the file.
void write_precision_trail(const Group& group, const PrecisionTrail& trail);
PrecisionTrail read_precision_trail(const Group& group);

}  // namespace nanscope::format
