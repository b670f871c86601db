// The agent's timeline: started and stopped by its operator (`kolo
// timeline`, the gRPC status service) or by the trainer of the only job here.
#include "agent/agent.h"
#include "common/log.h"

namespace kolo {

namespace {
auto logger() { return log::get("agent"); }
}  // namespace

StatusOr<std::string> Agent::timelineOnLoop(bool start, const std::string& path, bool mark_cycles) {
  if (!start) {
    std::string p = timeline_->path();
    RETURN_IF_ERROR(timeline_->stop());
    logger()->info("timeline stopped ({})", p);
    return p;
  }
  if (path.empty()) return invalidArgument("timeline start needs a file path");
  // "%a" stands for this agent's id, as in --timeline-filename, so that
  // several agents on one host write separate files.
  std::string file = substitutePathToken(path, "%a", opts_.agent_id);
  if (timeline_->active()) RETURN_IF_ERROR(timeline_->stop());
  RETURN_IF_ERROR(timeline_->start(file, mark_cycles));
  logger()->info("timeline started: {}", timeline_->path());
  return timeline_->path();
}

Status Agent::trainerTimelineOnLoop(ClientConn& c, const ipc::TimelineControl& t) {
  // The timeline is the agent's (one file, every job's tensors): a trainer
  // may switch it only while its job is the only one here, and may not touch
  // one the operator (or another job) started. The file path is confined by
  // timelineOnLoop.
  const bool ours = !timeline_job_.empty() && timeline_job_ == c.job_id && timeline_->active() &&
                    timeline_->path() == timeline_job_path_;
  if (timeline_->active() && !ours) {
    return permissionDenied(
        "TimelineControl from job " + c.job_id +
        " refused: the agent's timeline was started by its operator or another job; use "
        "`kolo timeline` on the agent");
  }
  if (jobs_.size() > 1) {
    return permissionDenied(
        "TimelineControl from job " + c.job_id + " refused: this agent serves " +
        std::to_string(jobs_.size() - 1) +
        " other job(s) and its timeline would record theirs; use `kolo timeline` on the agent");
  }
  if (!t.start() && !timeline_->active()) return okStatus();
  ASSIGN_OR_RETURN(std::string path, timelineOnLoop(t.start(), t.path(), t.mark_cycles()));
  if (t.start()) {
    timeline_job_ = c.job_id;
    timeline_job_path_ = path;
  } else {
    timeline_job_.clear();
    timeline_job_path_.clear();
  }
  return okStatus();
}

}  // namespace kolo
