// kolo-relay-floor: what one blocking wake-up costs on this machine, the
// floor under any small collective that crosses processes which sleep while
// they wait (docs/bench-tools.md, compare_multi.sh, "What the machine allows").
//
// P processes form a ring of Unix socket pairs; a 4-byte token goes round it
// R times, each process blocked in read() until the token reaches it. With P
// larger than the number of cores, every hop is a sleep and a wake-up. A
// 4-byte allreduce across two agents needs at least three such hops in a row
// (rank -> its agent, agent -> the other agent, agent -> rank) with four
// processes (two ranks, two agents) on the machine, so 3 x the per-hop time
// at P = 4 is the least it can take without busy polling.
//
// Prints one nccl-tests style row per process count: processes, hops per
// round, and the median, 10th and 90th percentile of the time per hop.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Moves exactly n bytes with `io` (::read or ::write), retrying short
// transfers and EINTR; false on an error or end of file.
template <typename Io, typename Ptr>
bool transferAll(Io io, int fd, Ptr p, size_t n) {
  while (n > 0) {
    ssize_t r = io(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool readAll(int fd, uint32_t* v) { return transferAll(::read, fd, reinterpret_cast<char*>(v), sizeof *v); }
bool writeAll(int fd, const uint32_t* v) {
  return transferAll(::write, fd, reinterpret_cast<const char*>(v), sizeof *v);
}

struct Row {
  int procs = 0;
  double p10 = 0, p50 = 0, p90 = 0;  // microseconds per hop
};

// Runs one ring of `procs` processes; false (with a message) on failure.
bool runRing(int procs, int rounds, int warmup, Row* row) {
  std::vector<int> fds(2 * static_cast<size_t>(procs));
  for (int i = 0; i < procs; ++i) {  // link i carries the token from process i to i + 1
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, &fds[2 * static_cast<size_t>(i)]) != 0) {
      std::fprintf(stderr, "kolo-relay-floor: socketpair: %s\n", std::strerror(errno));
      return false;
    }
  }
  auto linkOut = [&](int i) { return fds[2 * static_cast<size_t>(i)]; };
  auto linkIn = [&](int i) { return fds[2 * static_cast<size_t>(i) + 1]; };
  const int total = warmup + rounds;
  std::vector<pid_t> kids;
  for (int p = 1; p < procs; ++p) {
    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "kolo-relay-floor: fork: %s\n", std::strerror(errno));
      for (pid_t k : kids) ::kill(k, SIGKILL);
      for (pid_t k : kids) ::waitpid(k, nullptr, 0);
      return false;
    }
    if (pid == 0) {
      // Dies with the parent's sockets: a read or write error ends it.
      uint32_t token = 0;
      for (int r = 0; r < total; ++r) {
        if (!readAll(linkIn(p - 1), &token)) ::_exit(1);
        if (!writeAll(linkOut(p), &token)) ::_exit(1);
      }
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  std::vector<double> per_hop;
  per_hop.reserve(static_cast<size_t>(rounds));
  bool ok = true;
  uint32_t token = 0;
  for (int r = 0; r < total && ok; ++r) {
    auto t0 = Clock::now();
    ok = writeAll(linkOut(0), &token) && readAll(linkIn(procs - 1), &token);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (r >= warmup) per_hop.push_back(us / procs);
  }
  for (int fd : fds) ::close(fd);
  for (pid_t k : kids) {
    int st = 0;
    while (::waitpid(k, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = false;
  }
  if (!ok) {
    std::fprintf(stderr, "kolo-relay-floor: the ring of %d processes broke\n", procs);
    return false;
  }
  std::sort(per_hop.begin(), per_hop.end());
  auto pct = [&](double q) { return per_hop[static_cast<size_t>(q * static_cast<double>(per_hop.size() - 1))]; };
  *row = Row{procs, pct(0.1), pct(0.5), pct(0.9)};
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kolo-relay-floor: the time of one blocking wake-up between processes on this machine"};
  std::vector<int> procs{2, 3, 4};
  int rounds = 20000;
  int warmup = 1000;
  app.add_option("-p,--procs", procs, "process counts, one row each (2..64)")
      ->check(CLI::Range(2, 64))
      ->delimiter(',');
  app.add_option("-n,--rounds", rounds, "timed rounds of the token per row")->check(CLI::Range(10, 10'000'000));
  app.add_option("-w,--warmup", warmup, "untimed rounds first")->check(CLI::Range(0, 10'000'000));
  CLI11_PARSE(app, argc, argv);

  long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("# kolo-relay-floor: a 4-byte token round a ring of P processes over Unix sockets, each blocked\n");
  std::printf("# in read() until it arrives; %d rounds (+%d warm-up); %ld online cores\n", rounds, warmup, cores);
  std::printf("#%9s%10s%16s%16s%16s\n", "procs", "hops", "hop p10(us)", "hop p50(us)", "hop p90(us)");
  for (int p : procs) {
    Row row;
    if (!runRing(p, rounds, warmup, &row)) return 1;
    std::printf("%10d%10d%16.2f%16.2f%16.2f\n", row.procs, row.procs, row.p10, row.p50, row.p90);
    std::fflush(stdout);
  }
  return 0;
}
