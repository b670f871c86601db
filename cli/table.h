// Aligned text tables and the small formatting helpers of the `kolo` CLI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolo::cli {

// Columns separated by two spaces, padded to the widest cell; the last
// column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  bool empty() const { return rows_.empty(); }
  std::string render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// "850 ms", "3.2 s", "4m 05s", "2h 03m", "3d 04h".
std::string formatDuration(int64_t ms);
// "512 B", "1.5 KiB", "64.0 MiB", ...
std::string formatBytes(uint64_t bytes);
// Items separated by `sep`.
std::string join(const std::vector<std::string>& items, const std::string& sep);
// Sorted ranks as ranges: {0,1,2,3,5} -> "0-3,5"; {} -> "-".
std::string formatRanks(std::vector<int> ranks);

}  // namespace kolo::cli
