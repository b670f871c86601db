// Stall inspector (Horovod's, per job): tracks names that some ranks have
// submitted while others have not, and reports those that have waited
// longer than the warning time, with the missing ranks and how long each
// submitted rank has waited. A second limit (shutdown time, 0 = off) names
// the jobs that must be shut down because a collective waited that long.
//
// Each stalled name is reported at most once per warning period: a check
// that finds it again before another warning period has passed stays quiet
// about it. Each job is named for shutdown once.
//
// Pure logic, loop thread, no locks; time is passed in by the caller.
// Cached names stuck that long should be invalidated by the caller so that
// they leave the fast path and get renegotiated (as Horovod does).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kolo::stall {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

struct StallOptions {
  std::chrono::milliseconds warning_time{std::chrono::seconds(60)};
  std::chrono::milliseconds shutdown_time{0};  // 0 = never shut down
  bool disabled = false;                       // no reports (tracking for `kolo job` goes on)
};

struct RankWait {
  int rank = 0;
  std::chrono::milliseconds waited{0};  // since this rank submitted
};

// One name of one job that is waiting for some ranks.
struct PendingTensor {
  std::string name;
  std::vector<RankWait> submitted;  // ordered by rank
  std::vector<int> missing;         // ranks that have not submitted, ascending
  std::string host;                 // where the missing ranks run ("" = not known)
  std::chrono::milliseconds age{0};  // since the first submission
  bool past_shutdown = false;         // waited longer than the shutdown time
};

struct JobStalls {
  std::string job_id;
  std::vector<PendingTensor> tensors;  // ordered by name
  bool must_shut_down = false;
};

struct StallReport {
  std::vector<JobStalls> jobs;        // jobs with something to report, ordered by id
  std::vector<std::string> shutdown;  // jobs to shut down now (each named once)
  std::string text;                   // the log text ("" when nothing to report)
  bool empty() const { return jobs.empty() && shutdown.empty(); }
};

class StallInspector {
 public:
  explicit StallInspector(StallOptions options = {}) : options_(options) {}

  const StallOptions& options() const { return options_; }
  void setOptions(const StallOptions& options) { options_ = options; }

  // The ranks a job's names wait for (global ranks), and the host they run
  // on (named in the report; "" = not named). Replaces any previous set;
  // names already tracked keep their submissions.
  void setJobRanks(const std::string& job, std::vector<int> ranks, const std::string& host = "");
  void setJobSize(const std::string& job, int world_size);
  void removeJob(const std::string& job);

  // `rank` submitted `name` at `now` (a repeated submission keeps the first time).
  void recordSubmit(const std::string& job, const std::string& name, int rank, TimePoint now);
  // `name` is ready on every rank (or failed): stop tracking it.
  void recordDone(const std::string& job, const std::string& name);

  // Reports names waiting longer than the warning time (each once per
  // warning period) and jobs past the shutdown time (with every name that
  // waits longer than the warning time). Logs the text at warn level
  // unless it is empty.
  StallReport check(TimePoint now);

  // Everything a job is waiting for now, stalled or not (for `kolo job ID`).
  std::vector<PendingTensor> pending(const std::string& job, TimePoint now) const;
  size_t pendingCount(const std::string& job) const;

  // Log text for a report (our words, in Horovod's shape), and for one job
  // of it (what that job's ranks are shown).
  static std::string formatReport(const StallReport& report, const StallOptions& options);
  static std::string formatJob(const JobStalls& job, const StallOptions& options);
  // One line for a job's failure status (it must fit a completion's error
  // text): "rank 1 (host h) has not submitted a, b; rank 3 ...".
  static std::string summarizeJob(const JobStalls& job);

 private:
  struct Tensor {
    std::map<int, TimePoint> submitted;
    TimePoint first{};
    TimePoint last_reported{};
    bool reported = false;
  };
  struct Job {
    std::vector<int> ranks;
    std::string host;
    std::map<std::string, Tensor> tensors;
    bool shutdown_reported = false;
  };
  PendingTensor describe(const std::string& name, const Tensor& t, const Job& job,
                         TimePoint now) const;

  StallOptions options_;
  std::map<std::string, Job> jobs_;
};

}  // namespace kolo::stall
