// CPU cost of a benchmark (cpu-s/GB): the CPU seconds of the
// processes taking part (the ranks themselves, getrusage; the agents, found
// by their socket, from their process CPU clock) and the figure the tables
// print, CPU seconds per GB reduced. Linux only; pure parts unit-tested.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace kolo::bench {

// CPU seconds (user + system, every thread) of this process so far
// (getrusage RUSAGE_SELF).
double selfCpuSeconds();

// CPU seconds (user + system, every thread, exited ones included) of process
// `pid` so far, from its process CPU-time clock (clock_getcpuclockid: ns
// resolution, where /proc/PID/stat counts 10 ms ticks); nullopt when the
// process is gone or its clock cannot be read.
std::optional<double> processCpuSeconds(pid_t pid);

// The process that holds the Unix socket bound to `path` (the listening
// socket and the connections it accepted carry the path in /proc/net/unix;
// a connecting client's socket does not), found by the socket's inode among
// /proc/*/fd. nullopt when none is found (another network namespace's
// sockets are not listed; an unreadable /proc).
std::optional<pid_t> socketOwnerPid(const std::string& path);

// The agent socket libkolo connects to: KOLO_AGENT_SOCKET, else the
// default /run/kolo/agent.sock.
std::string agentSocketPath();

// CPU seconds per GB, where GB = bytes x iterations / 1e9 (the bytes one
// rank passes to the operation, times the timed iterations): 0 when nothing
// was moved.
double cpuSecondsPerGB(double cpu_s, uint64_t bytes, int iters);

// The column the tables print after #wrong, and its definition for the
// header line that precedes the table.
extern const char* const kCpuColumnDefinition;

}  // namespace kolo::bench
