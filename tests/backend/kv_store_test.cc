#include "agent/backends/kv_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

namespace kolo {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kolo-kv-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void checkStore(KvStore& a, KvStore& b) {
  const std::string binary(
      "\0\x01\xff"
      "addr",
      7);
  ASSERT_TRUE(a.put("g1/ucx/0", binary).isOk());
  auto v = b.get("g1/ucx/0", 1s);
  ASSERT_TRUE(v.isOk()) << v.status().toString();
  EXPECT_EQ(*v, binary);

  ASSERT_TRUE(a.put("g1/ucx/0", "newer").isOk());
  EXPECT_EQ(b.get("g1/ucx/0", 1s).value(), "newer");

  const auto t0 = Clock::now();
  auto missing = b.get("g1/ucx/9", 200ms);
  EXPECT_EQ(missing.status().code(), Code::kTimedOut);
  EXPECT_GE(Clock::now() - t0, 200ms);
  EXPECT_LT(Clock::now() - t0, 2s);

  // A get that waits is woken by a later put.
  std::thread writer([&] { ASSERT_TRUE(a.put("g1/ucx/1", "late").isOk()); });
  auto late = b.get("g1/ucx/1", 10s);
  writer.join();
  ASSERT_TRUE(late.isOk()) << late.status().toString();
  EXPECT_EQ(*late, "late");
}

TEST(KvStore, InMemory) {
  InMemoryKvStore s;
  checkStore(s, s);
}

TEST(KvStore, FilesSharedThroughADirectory) {
  TempDir dir;
  FileKvStore a(dir.path()), b(dir.path());
  checkStore(a, b);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/" + FileKvStore::fileNameForKey("g1/ucx/0")));
}

TEST(KvStore, FileNamesAreEscaped) {
  EXPECT_EQ(FileKvStore::fileNameForKey("g1/ucx/0"), "g1%2Fucx%2F0");
  EXPECT_EQ(FileKvStore::fileNameForKey("a-b_c.d"), "a-b_c.d");
  EXPECT_EQ(FileKvStore::fileNameForKey(".."), "%..");
  EXPECT_EQ(FileKvStore::fileNameForKey(""), "%");
}

TEST(KvStore, FileStoreInAMissingDirectoryFails) {
  FileKvStore s("/nonexistent/kolo-kv");
  EXPECT_FALSE(s.put("k", "v").isOk());
  EXPECT_FALSE(s.get("k", 10ms).isOk());
}

}  // namespace
}  // namespace kolo
