#include "cli/line_splitter.h"

#include <gtest/gtest.h>

#include <vector>

namespace kolo::cli {
namespace {

TEST(LineSplitter, LinesAcrossChunks) {
  std::vector<std::string> lines;
  LineSplitter s([&](std::string_view l) { lines.emplace_back(l); });
  s.feed("ab");
  EXPECT_TRUE(lines.empty());
  s.feed("c\nde\n\nf");
  EXPECT_EQ(lines, (std::vector<std::string>{"abc", "de", ""}));
  EXPECT_TRUE(s.hasPartial());
  s.flush();
  EXPECT_EQ(lines.back(), "f");
  s.flush();  // nothing left
  EXPECT_EQ(lines.size(), 4u);
}

TEST(LineSplitter, RunawayLineIsCut) {
  std::vector<std::string> lines;
  LineSplitter s([&](std::string_view l) { lines.emplace_back(l); });
  std::string big(LineSplitter::kMaxLine + 10, 'x');
  s.feed(big);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].size(), big.size());
  s.feed("y\n");
  EXPECT_EQ(lines.back(), "y");
}

}  // namespace
}  // namespace kolo::cli
