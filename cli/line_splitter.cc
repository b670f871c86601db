#include "cli/line_splitter.h"

namespace kolo::cli {

void LineSplitter::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(bytes);
      if (partial_.size() >= kMaxLine) flush();
      return;
    }
    if (partial_.empty()) {
      fn_(bytes.substr(0, nl));
    } else {
      partial_.append(bytes.substr(0, nl));
      fn_(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
}

void LineSplitter::flush() {
  if (partial_.empty()) return;
  std::string line;
  line.swap(partial_);
  fn_(line);
}

}  // namespace kolo::cli
