#pragma once
// How a batch row and its row in the data set read, in replay's report and
// suggestions and in the viewer: "batch row 3 (data set row 120)".
//
// `batch_rows` is a snapshot's /batch/rows: each batch position's row in the
// data set. Since format 1.2 an entry may be -1: the loop (the step guard in
// a user's own loop) was given no data set rows. Such a row, or a position
// past the list's end, reads "data set row unknown": never "-1", and never the
// batch position passed off as a data set row.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nanscope::format {

// A birth names at most this many of its rows (Birth::rows): a list this long
// may be missing some.
inline constexpr size_t kBirthRowsKept = 16;

// The data set row of batch row `batch_row`; nullopt when unknown.
std::optional<int64_t> dataset_row(const std::vector<int64_t>& batch_rows, int64_t batch_row);

// "data set row 120" | "data set row unknown"
std::string dataset_row_text(const std::vector<int64_t>& batch_rows, int64_t batch_row);

// "batch row 3 (data set row 120)"; several: "batch rows 3 (data set row 120),
// 7 (data set row unknown)".
std::string batch_rows_text(const std::vector<int64_t>& batch_rows, const std::vector<int64_t>& rows);

}  // namespace nanscope::format
