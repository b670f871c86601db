#include "agent/stall/stall_inspector.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "common/log.h"

namespace kolo::stall {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

double seconds(milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

}  // namespace

void StallInspector::setJobRanks(const std::string& job, std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  jobs_[job].ranks = std::move(ranks);
}

void StallInspector::setJobSize(const std::string& job, int world_size) {
  std::vector<int> ranks(static_cast<size_t>(std::max(world_size, 0)));
  std::iota(ranks.begin(), ranks.end(), 0);
  setJobRanks(job, std::move(ranks));
}

void StallInspector::removeJob(const std::string& job) { jobs_.erase(job); }

void StallInspector::recordSubmit(const std::string& job, const std::string& name, int rank,
                                  TimePoint now) {
  Tensor& t = jobs_[job].tensors[name];
  if (t.submitted.empty()) t.first = now;
  t.submitted.try_emplace(rank, now);
}

void StallInspector::recordDone(const std::string& job, const std::string& name) {
  auto it = jobs_.find(job);
  if (it != jobs_.end()) it->second.tensors.erase(name);
}

size_t StallInspector::pendingCount(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.tensors.size();
}

PendingTensor StallInspector::describe(const std::string& name, const Tensor& t, const Job& job,
                                       TimePoint now) const {
  PendingTensor p;
  p.name = name;
  p.age = duration_cast<milliseconds>(now - t.first);
  for (const auto& [rank, when] : t.submitted) {
    p.submitted.push_back({rank, duration_cast<milliseconds>(now - when)});
  }
  for (int r : job.ranks) {
    if (!t.submitted.count(r)) p.missing.push_back(r);
  }
  p.past_shutdown = options_.shutdown_time.count() > 0 && p.age >= options_.shutdown_time;
  return p;
}

std::vector<PendingTensor> StallInspector::pending(const std::string& job, TimePoint now) const {
  std::vector<PendingTensor> out;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return out;
  for (const auto& [name, t] : it->second.tensors) out.push_back(describe(name, t, it->second, now));
  return out;
}

StallReport StallInspector::check(TimePoint now) {
  StallReport report;
  if (options_.disabled) return report;
  const milliseconds warn = options_.warning_time;
  for (auto& [job_id, job] : jobs_) {
    JobStalls js;
    js.job_id = job_id;
    bool past_shutdown = false;
    for (auto& [name, t] : job.tensors) {
      if (now - t.first < warn) continue;
      PendingTensor p = describe(name, t, job, now);
      past_shutdown = past_shutdown || p.past_shutdown;
      if (t.reported && now - t.last_reported < warn) continue;
      t.reported = true;
      t.last_reported = now;
      js.tensors.push_back(std::move(p));
    }
    if (past_shutdown && !job.shutdown_reported) {
      job.shutdown_reported = true;
      js.must_shut_down = true;
      report.shutdown.push_back(job_id);
    }
    if (!js.tensors.empty() || js.must_shut_down) report.jobs.push_back(std::move(js));
  }
  if (!report.empty()) {
    report.text = formatReport(report, options_);
    log::get("agent.stall")->warn("{}", report.text);
  }
  return report;
}

std::string StallInspector::formatReport(const StallReport& report, const StallOptions& options) {
  std::string out;
  for (const JobStalls& js : report.jobs) {
    if (!out.empty()) out += '\n';
    if (!js.tensors.empty()) {
      out += fmt::format(
          "job {}: {} collective(s) submitted by only some ranks have waited more than {:g} s "
          "for the others. The ranks that have not submitted them may be stuck, have crashed, "
          "or be running different code.",
          js.job_id, js.tensors.size(), seconds(options.warning_time));
      // Missing rank -> names it has not submitted (Horovod groups by rank).
      std::map<int, std::vector<const PendingTensor*>> by_rank;
      for (const auto& p : js.tensors) {
        for (int r : p.missing) by_rank[r].push_back(&p);
      }
      out += "\n  Missing ranks:";
      if (by_rank.empty()) out += " unknown (the job's ranks are not set)";
      for (const auto& [rank, tensors] : by_rank) {
        bool past = std::any_of(tensors.begin(), tensors.end(),
                                [](const PendingTensor* p) { return p->past_shutdown; });
        out += fmt::format("\n    {}{}: [", rank, past ? "!" : "");
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (i > 0) out += ", ";
          out += tensors[i]->name;
        }
        out += "]";
      }
      for (const auto& p : js.tensors) {
        out += fmt::format("\n  {} waiting {:.1f} s; submitted by", p.name, seconds(p.age));
        for (size_t i = 0; i < p.submitted.size(); ++i) {
          out += fmt::format("{} {} ({:.1f} s ago)", i > 0 ? "," : "", p.submitted[i].rank,
                             seconds(p.submitted[i].waited));
        }
      }
    }
    if (js.must_shut_down) {
      if (!out.empty() && out.back() != '\n') out += '\n';
      out += fmt::format(
          "job {}: a collective has waited more than {:g} s (stall-shutdown-time-s); ranks "
          "marked ! are past it. Shutting the job down.",
          js.job_id, seconds(options.shutdown_time));
    }
  }
  return out;
}

}  // namespace kolo::stall
