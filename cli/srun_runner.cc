// JobRunner's --launcher srun path (docs/slurm.md): the allocation's nodes,
// each with its own kolo-agent, and one srun step for every rank.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "cli/job_runner.h"
#include "cli/srun_launch.h"

namespace kolo::cli {

Status JobRunner::prepareSrunNodes() {
  std::map<std::string, std::string> env = processEnvironment();
  ASSIGN_OR_RETURN(std::vector<HostSlots> hosts, allocationHosts(env));
  std::vector<int> slots;
  for (const HostSlots& h : hosts) slots.push_back(h.slots);
  auto per_node = fillSlots(opts_.np, slots);
  if (!per_node.isOk()) {
    return invalidArgument(per_node.status().message() + " (the Slurm allocation " +
                           env["SLURM_JOB_ID"] + ": SLURM_TASKS_PER_NODE " +
                           env["SLURM_TASKS_PER_NODE"] + ")");
  }
  srun_ = true;
  const char* env_socket = std::getenv("KOLO_AGENT_SOCKET");
  const std::string socket = opts_.agent_socket != kDefaultAgentSocket || env_socket == nullptr
                                 ? opts_.agent_socket
                                 : env_socket;
  for (size_t i = 0; i < per_node->size(); ++i)
    plan_.nodes.push_back({hosts[i].host, false, "", socket, ""});
  plan_.coordinator = env.count("KOLO_COORDINATOR") != 0 ? env["KOLO_COORDINATOR"] : "";
  plan_.ranks = placeRanks(*per_node);
  if (opts_.verbose) {
    say("inside Slurm allocation " + env["SLURM_JOB_ID"] + ": ranks start as one srun step on " +
        std::to_string(plan_.nodes.size()) + " node(s), each with its kolo-agent at " + socket);
  }
  return okStatus();
}

Status JobRunner::spawnSrunStep() {
  // The placement: one host per rank in SLURM_HOSTFILE (srun reads it here).
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kolorun-srun-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    return errnoStatus("cannot create a directory for SLURM_HOSTFILE", errno);
  srun_hostfile_dir_ = templ;
  const std::string hostfile = templ + "/hostfile";
  {
    UniqueFd fd(::open(hostfile.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return errnoStatus("cannot create " + hostfile, errno);
    writeAll(fd.get(), srunHostfile(plan_));
  }
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return errnoStatus("cannot find kolorun's own path", errno);
  self[n] = '\0';
  ranks_.resize(static_cast<size_t>(plan_.size()));
  SpawnSpec spec;
  spec.name = "srun";
  spec.argv = srunArgv(plan_, self);
  spec.env = srunStepEnv(plan_);
  spec.env.emplace_back("SLURM_HOSTFILE", hostfile);
  // srun --label: "3: text" becomes kolorun's "[3]<stdout>:text".
  auto forward = [](int fd, const char* stream) {
    return [fd, stream](std::string_view line) {
      int task = 0;
      std::string_view text;
      std::string out = splitSrunLabel(line, &task, &text)
                            ? "[" + std::to_string(task) + "]<" + stream + ">:" + std::string(text)
                            : "[srun]<" + std::string(stream) + ">:" + std::string(line);
      out += '\n';
      writeAll(fd, out);
    };
  };
  spec.on_stdout = forward(STDOUT_FILENO, "stdout");
  // srun names the first task that failed ("srun: error: n1: task 1: Exited
  // with exit code 3"); its code is the job's, as with kolorun's own ranks
  // (srun's own exit code is the highest of all, 143 for those it stopped).
  spec.on_stderr = [this, line_out = forward(STDERR_FILENO, "stderr")](std::string_view line) {
    line_out(line);
    int rank = -1, code = 0;
    if (!failed_rank_ && parseSrunTaskExit(line, &rank, &code)) {
      failed_rank_ = rank;
      srun_failed_code_ = code;
    }
  };
  spec.on_exit = [this](const ExitInfo& info) {
    RankState& rs = ranks_[0];
    rs.done = true;
    rs.exit = info;
    if (info.success() || kill_deadline_) return;
    if (failed_rank_) {
      say("rank " + std::to_string(*failed_rank_) + " exited with code " +
          std::to_string(srun_failed_code_));
      exit_code_ = srun_failed_code_;
    } else {
      say("the srun step " + info.describe());
      exit_code_ = info.shellCode();
    }
  };
  started_ = Clock::now();
  auto id = sup_->spawn(std::move(spec));
  if (!id.isOk()) return id.status().withContext("cannot start srun");
  ranks_[0].child = *id;
  return okStatus();
}

}  // namespace kolo::cli
