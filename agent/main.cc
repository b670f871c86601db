// kolo-agent: the per-node communication daemon.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "agent/agent.h"
#include "agent/agent_config.h"
#include "agent/core/cross_memory.h"
#include "common/log.h"

int main(int argc, char** argv) {
  // Block the termination signals in every thread; the loop reads them from a signalfd.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // --version (before "--"): the version, exit 0.
  for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i) {
    if (std::string_view(argv[i]) == "--version") {
      std::printf("%s %s\n", "kolo-agent", KOLO_VERSION);
      return 0;
    }
  }
  // The socket is KOLO_AGENT_SOCKET everywhere (clients, kolorun, the
  // agent); the agent's older KOLO_SOCKET still works, with a warning, and
  // loses to KOLO_AGENT_SOCKET.
  if (const char* old = std::getenv("KOLO_SOCKET"); old != nullptr) {
    const char* now = std::getenv("KOLO_AGENT_SOCKET");
    if (now != nullptr) {
      std::fprintf(
          stderr,
          "kolo-agent: KOLO_SOCKET is deprecated and ignored: KOLO_AGENT_SOCKET=%s is set\n", now);
      ::unsetenv("KOLO_SOCKET");
    } else {
      std::fprintf(stderr,
                   "kolo-agent: KOLO_SOCKET is deprecated; set KOLO_AGENT_SOCKET instead\n");
    }
  }
  kolo::Config cfg("kolo-agent");
  kolo::defineAgentKnobs(cfg);
  kolo::Status st = cfg.load(argc, argv);
  if (!st.isOk()) {
    std::fprintf(stderr, "kolo-agent: %s\n", st.message().c_str());
    return 2;
  }
  if (cfg.wantsHelp()) {
    std::cout << cfg.helpText();
    return 0;
  }
  if (cfg.wantsMarkdown()) {
    std::cout << cfg.markdown();
    return 0;
  }
  if (cfg.wantsDump()) {
    std::cout << cfg.dump();
    return 0;
  }
  kolo::log::init("kolo-agent", cfg.getString("log-level"));
  kolo::log::setThreadName("agent-main");
  auto opts = kolo::agentOptionsFrom(cfg);
  if (!opts.isOk()) {
    std::fprintf(stderr, "kolo-agent: %s\n", opts.status().message().c_str());
    return 2;
  }
  // --mps-pipe-dir: the agent's own CUDA contexts use that daemon too (set
  // before any thread or CUDA call reads the environment).
  if (!cfg.getString("mps-pipe-dir").empty()) {
    ::setenv("CUDA_MPS_PIPE_DIRECTORY", opts->mps_pipe_dir.c_str(), 1);
  }
  // --device: chosen before anything uses the device path (the host
  // emulation warns loudly here).
  if (opts->device != kolo::gpu::DeviceKind::kCuda) {
    st = kolo::gpu::selectDeviceApi(opts->device);
    if (!st.isOk()) {
      std::fprintf(stderr, "kolo-agent: %s\n", st.message().c_str());
      return 2;
    }
  }
  kolo::dropPtraceCapability();  // before any thread: they inherit the effective set
  kolo::Agent agent(*opts);
  st = agent.start();
  if (!st.isOk() && agent.stopSignal() != 0) {
    // SIGTERM while waiting for the coordinator: a clean stop, not a failure.
    kolo::log::get("agent")->info("{}", st.message());
    return 0;
  }
  if (!st.isOk()) {
    kolo::log::get("agent")->error("cannot start: {}", st.toString());
    std::fprintf(stderr, "kolo-agent: cannot start: %s\n", st.message().c_str());
    return 1;
  }
  agent.run();
  kolo::log::get("agent")->info("stopped");
  return 0;
}
