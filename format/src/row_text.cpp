#include "nanscope/format/row_text.hpp"

namespace nanscope::format {

std::optional<int64_t> dataset_row(const std::vector<int64_t>& batch_rows, int64_t batch_row) {
  if (batch_row < 0 || size_t(batch_row) >= batch_rows.size() || batch_rows[size_t(batch_row)] < 0) return std::nullopt;
  return batch_rows[size_t(batch_row)];
}

std::string dataset_row_text(const std::vector<int64_t>& batch_rows, int64_t batch_row) {
  const std::optional<int64_t> row = dataset_row(batch_rows, batch_row);
  return "data set row " + (row ? std::to_string(*row) : std::string("unknown"));
}

std::string batch_rows_text(const std::vector<int64_t>& batch_rows, const std::vector<int64_t>& rows) {
  std::string out = rows.size() == 1 ? "batch row " : "batch rows ";
  for (size_t i = 0; i < rows.size(); ++i)
    out += (i ? ", " : "") + std::to_string(rows[i]) + " (" + dataset_row_text(batch_rows, rows[i]) + ")";
  return out;
}

}  // namespace nanscope::format
