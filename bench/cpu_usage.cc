#include "bench/cpu_usage.h"

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unordered_set>

namespace kolo::bench {

const char* const kCpuColumnDefinition =
    "cpu-s/GB = CPU seconds (user + system) of every rank and agent over the timed iterations / "
    "(size x iterations / 1e9)";

double selfCpuSeconds() {
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
  auto sec = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

std::optional<double> processCpuSeconds(pid_t pid) {
  clockid_t clock{};
  if (::clock_getcpuclockid(pid, &clock) != 0) return std::nullopt;
  timespec ts{};
  if (::clock_gettime(clock, &ts) != 0) return std::nullopt;
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::optional<pid_t> socketOwnerPid(const std::string& path) {
  // /proc/net/unix: "Num RefCount Protocol Flags Type St Inode Path".
  std::unordered_set<std::string> inodes;
  std::ifstream unix_table("/proc/net/unix");
  std::string line;
  std::getline(unix_table, line);  // the header
  while (std::getline(unix_table, line)) {
    std::istringstream in(line);
    std::string num, refs, proto, flags, type, st, inode, p;
    if ((in >> num >> refs >> proto >> flags >> type >> st >> inode >> p) && p == path) {
      inodes.insert("socket:[" + inode + "]");
    }
  }
  if (inodes.empty()) return std::nullopt;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return std::nullopt;
  std::optional<pid_t> owner;
  while (!owner) {
    dirent* e = ::readdir(proc);
    if (e == nullptr) break;
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    std::string fd_dir = std::string("/proc/") + e->d_name + "/fd";
    DIR* fds = ::opendir(fd_dir.c_str());
    if (fds == nullptr) continue;
    while (dirent* f = ::readdir(fds)) {
      char target[64];
      std::string link = fd_dir + "/" + f->d_name;
      ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      if (inodes.count(target) != 0) {
        owner = static_cast<pid_t>(pid);
        break;
      }
    }
    ::closedir(fds);
  }
  ::closedir(proc);
  return owner;
}

std::string agentSocketPath() {
  const char* sock = std::getenv("KOLO_AGENT_SOCKET");
  return sock != nullptr ? sock : "/run/kolo/agent.sock";
}

double cpuSecondsPerGB(double cpu_s, uint64_t bytes, int iters) {
  const double gb = static_cast<double>(bytes) * iters / 1e9;
  return gb > 0 ? cpu_s / gb : 0.0;
}

}  // namespace kolo::bench
