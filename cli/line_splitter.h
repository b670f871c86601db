// Splits a byte stream into lines: each complete line is handed over as soon
// as its '\n' arrives; flush() hands over a partial last line. A line longer
// than kMaxLine is handed over in pieces so one runaway writer cannot grow
// kolorun's memory without bound.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace kolo::cli {

class LineSplitter {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;
  // `line` excludes the '\n'.
  using LineFn = std::function<void(std::string_view line)>;

  explicit LineSplitter(LineFn fn) : fn_(std::move(fn)) {}

  void feed(std::string_view bytes);
  // Hands over what is left (a last line without '\n'), if anything.
  void flush();
  bool hasPartial() const { return !partial_.empty(); }

 private:
  LineFn fn_;
  std::string partial_;
};

}  // namespace kolo::cli
