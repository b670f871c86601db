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

void StallInspector::setJobRanks(const std::string& job, std::vector<int> ranks,
                                 const std::string& host) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  jobs_[job].ranks = std::move(ranks);
  jobs_[job].host = host;
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
  p.host = job.host;
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
    std::vector<PendingTensor> quiet;  // stalled, reported less than a period ago
    for (auto& [name, t] : job.tensors) {
      if (now - t.first < warn) continue;
      PendingTensor p = describe(name, t, job, now);
      past_shutdown = past_shutdown || p.past_shutdown;
      if (t.reported && now - t.last_reported < warn) {
        quiet.push_back(std::move(p));
        continue;
      }
      t.reported = true;
      t.last_reported = now;
      js.tensors.push_back(std::move(p));
    }
    if (past_shutdown && !job.shutdown_reported) {
      job.shutdown_reported = true;
      js.must_shut_down = true;
      report.shutdown.push_back(job_id);
      // The shutdown's text names everything the job waited for.
      for (auto& p : quiet) js.tensors.push_back(std::move(p));
      std::sort(js.tensors.begin(), js.tensors.end(),
                [](const PendingTensor& a, const PendingTensor& b) { return a.name < b.name; });
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
    out += formatJob(js, options);
  }
  return out;
}

std::string StallInspector::summarizeJob(const JobStalls& js) {
  std::map<int, std::vector<const PendingTensor*>> by_rank;
  for (const auto& p : js.tensors) {
    for (int r : p.missing) by_rank[r].push_back(&p);
  }
  std::string out;
  size_t shown = 0;
  for (const auto& [rank, tensors] : by_rank) {
    if (shown == 3) {
      out += fmt::format("; and {} more rank(s)", by_rank.size() - shown);
      break;
    }
    const std::string& host = tensors.front()->host;
    out += fmt::format("{}rank {}{} has not submitted {}", shown > 0 ? "; " : "", rank,
                       host.empty() ? "" : " (host " + host + ")", tensors.front()->name);
    if (tensors.size() > 1) out += fmt::format(" and {} more", tensors.size() - 1);
    ++shown;
  }
  return out.empty() ? "the missing ranks are not known" : out;
}

std::string StallInspector::formatJob(const JobStalls& js, const StallOptions& options) {
  std::string out;
  if (!js.tensors.empty()) {
    out += fmt::format(
        "job {}: {} collective(s) submitted by only some ranks have waited more than {:g} s "
        "for the others. The ranks that have not submitted them may be stuck, have crashed, "
        "or be running different code (a different tensor name, or a collective that only "
        "some ranks call).",
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
      const std::string& host = tensors.front()->host;
      out += fmt::format("\n    {}{}{}: [", rank, past ? "!" : "",
                         host.empty() ? "" : " (host " + host + ")");
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
    out +=
        "\n  Look at what the missing ranks are doing (py-spy dump --pid, gdb -p); "
        "every rank must call the same collectives with the same names.";
  }
  if (js.must_shut_down) {
    if (!out.empty()) out += '\n';
    out += fmt::format(
        "job {}: a collective has waited more than {:g} s (stall-shutdown-time-s); ranks "
        "marked ! are past it. Shutting the job down.",
        js.job_id, seconds(options.shutdown_time));
  }
  return out;
}

}  // namespace kolo::stall
