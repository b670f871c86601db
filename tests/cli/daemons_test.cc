// Small pieces of kolorun's embedded mode: ready files, log tails, finding
// the daemon programs.
#include "cli/daemons.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "test_process.h"

namespace kolo::cli {
namespace {

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(ReadyFile, AddressOnceCompleteExtraWordsIgnored) {
  clitest::TempDir tmp;
  std::string f = tmp.path() + "/x.ready";
  EXPECT_FALSE(readReadyFile(f).has_value());  // not there yet
  write(f, "127.0.0.1:4000");
  EXPECT_FALSE(readReadyFile(f).has_value());  // no newline: still being written
  write(f, "127.0.0.1:4000\n");
  EXPECT_EQ(readReadyFile(f), "127.0.0.1:4000");
  write(f, "127.0.0.1:4001 metrics=127.0.0.1:9\n");
  EXPECT_EQ(readReadyFile(f), "127.0.0.1:4001");
  write(f, "\n");
  EXPECT_FALSE(readReadyFile(f).has_value());
}

TEST(FileTail, LastLines) {
  clitest::TempDir tmp;
  std::string f = tmp.path() + "/log";
  write(f, "1\n2\n3\n4\n");
  EXPECT_EQ(fileTail(f, 2), "3\n4\n");
  EXPECT_EQ(fileTail(f, 10), "1\n2\n3\n4\n");
  EXPECT_EQ(fileTail(tmp.path() + "/none", 3), "");
}

TEST(FindKoloProgram, OverrideMustBeExecutable) {
  ::setenv("KOLO_TEST_PROGRAM_BIN", "/no/such/file", 1);
  auto bad = findKoloProgram("kolo-nothing", "KOLO_TEST_PROGRAM_BIN");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("KOLO_TEST_PROGRAM_BIN=/no/such/file is not an executable file"),
            std::string::npos);
  ::setenv("KOLO_TEST_PROGRAM_BIN", "/bin/sh", 1);
  auto good = findKoloProgram("kolo-nothing", "KOLO_TEST_PROGRAM_BIN");
  ASSERT_TRUE(good.isOk());
  EXPECT_EQ(*good, "/bin/sh");
  ::unsetenv("KOLO_TEST_PROGRAM_BIN");
  auto missing = findKoloProgram("kolo-no-such-program", "KOLO_TEST_PROGRAM_BIN");
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("cannot find kolo-no-such-program"), std::string::npos);
  EXPECT_NE(missing.status().message().find("or set KOLO_TEST_PROGRAM_BIN"), std::string::npos);
}

}  // namespace
}  // namespace kolo::cli
