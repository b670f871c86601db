// Helpers shared by the client tests: a private temp dir and a scoped
// environment. Uses only the C library (also built against libkolo.so).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kolo::testing {

// mkdtemp under $TMPDIR (or /tmp); removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") +
                       "/kolo-client-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  bool valid() const { return !path_.empty(); }

 private:
  std::string path_;
};

// Sets variables for its lifetime and restores the previous values after.
class ScopedEnv {
 public:
  ScopedEnv() = default;
  ~ScopedEnv() {
    for (auto& [name, old] : saved_) {
      if (old) ::setenv(name.c_str(), old->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  void set(const std::string& name, const std::string& value) {
    save(name);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) {
    save(name);
    ::unsetenv(name.c_str());
  }
  // A complete single-rank job environment pointing at `socket`.
  void setJob(const std::string& socket) {
    for (const char* v : {"HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                          "KOLO_CONFIG", "KOLO_ARENA_MB", "KOLO_OP_TIMEOUT"}) {
      unset(v);
    }
    set("KOLO_AGENT_SOCKET", socket);
    set("KOLO_JOB_ID", "job-test");
    set("KOLO_JOB_TOKEN", "secret-token");
    set("KOLO_SIZE", "1");
    set("KOLO_LOCAL_RANK", "0");
    set("KOLO_LOCAL_SIZE", "1");
    set("KOLO_START_TIMEOUT", "10");
  }

 private:
  void save(const std::string& name) {
    if (saved_.count(name) != 0) return;
    const char* v = std::getenv(name.c_str());
    saved_[name] = v != nullptr ? std::optional<std::string>(v) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace kolo::testing
