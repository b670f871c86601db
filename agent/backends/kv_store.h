// A tiny rendezvous store used while a backend connects (gloo's
// rendezvous/store.h): agents put their addresses and wait for the others'.
// Values are opaque bytes. Implementations are thread-safe.
//   - InMemoryKvStore: one process, peers as threads (tests).
//   - FileKvStore: a directory shared by processes on one machine (tests).
//   - the agent's store over the coordinator's job-scoped KvPut/KvGet.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kolo {

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Stores `value` under `key` (replacing an older value).
  virtual Status put(const std::string& key, std::string_view value) = 0;
  // Waits until `key` exists and returns its value; TimedOut after `timeout`.
  virtual StatusOr<std::string> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

class InMemoryKvStore final : public KvStore {
 public:
  Status put(const std::string& key, std::string_view value) override;
  StatusOr<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// One file per key in `dir` (which must exist). put() writes a temporary
// file and renames it into place, so a reader never sees a partial value;
// get() waits with inotify, bounded by the timeout.
class FileKvStore final : public KvStore {
 public:
  explicit FileKvStore(std::string dir) : dir_(std::move(dir)) {}
  Status put(const std::string& key, std::string_view value) override;
  StatusOr<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override;

  // The file name a key is stored under (anything outside [A-Za-z0-9._-] is %XX-escaped).
  static std::string fileNameForKey(const std::string& key);

 private:
  std::string dir_;
};

}  // namespace kolo
