#include "cli/kolo_commands.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>

#include "cli/status_format.h"
#include "kolo/proto/agent.grpc.pb.h"
#include "kolo/proto/coordinator.grpc.pb.h"

namespace kolo::cli {

namespace {

std::string grpcCodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    default: return "error " + std::to_string(static_cast<int>(c));
  }
}

// Prints why a call failed and returns the exit code (1).
int fail(std::ostream& err, const std::string& daemon, const std::string& address, const grpc::Status& s) {
  std::string msg;
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      msg = "cannot reach the kolo " + daemon + " at " + address + ": " + s.error_message();
      break;
    case grpc::StatusCode::UNIMPLEMENTED:
      msg = "the kolo " + daemon + " at " + address + " does not support this request: " + s.error_message();
      break;
    default:
      msg = "the kolo " + daemon + " at " + address + " answered " + grpcCodeName(s.error_code()) + ": " +
            s.error_message();
  }
  err << "kolo: " << msg << "\n";
  return 1;
}

void setDeadline(grpc::ClientContext& ctx, const KoloCliOptions& o) {
  ctx.set_deadline(std::chrono::system_clock::now() + o.deadline);
}

std::unique_ptr<agentrpc::Agent::Stub> agentStub(const KoloCliOptions& o) {
  return agentrpc::Agent::NewStub(grpc::CreateChannel(o.agent, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<coord::Coordinator::Stub> coordinatorStub(const KoloCliOptions& o) {
  return coord::Coordinator::NewStub(grpc::CreateChannel(o.coordinator, grpc::InsecureChannelCredentials()));
}

int64_t nowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int cmdStatus(const KoloCliOptions& o, std::ostream& out, std::ostream& err) {
  grpc::ClientContext ctx;
  setDeadline(ctx, o);
  agentrpc::AgentStatus reply;
  grpc::Status s = agentStub(o)->GetStatus(&ctx, agentrpc::StatusRequest(), &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s);
  out << (o.json ? toJson(reply).dump(2) + "\n" : renderAgentStatus(reply));
  return 0;
}

int cmdJobs(const KoloCliOptions& o, std::ostream& out, std::ostream& err) {
  grpc::ClientContext ctx;
  setDeadline(ctx, o);
  coord::ListJobsReply reply;
  grpc::Status s = coordinatorStub(o)->ListJobs(&ctx, coord::ListJobsRequest(), &reply);
  if (!s.ok()) return fail(err, "coordinator", o.coordinator, s);
  int64_t now = nowUnixMs();
  out << (o.json ? toJson(reply, now).dump(2) + "\n" : renderCoordinatorJobs(reply, now));
  return 0;
}

int cmdAgents(const KoloCliOptions& o, std::ostream& out, std::ostream& err) {
  grpc::ClientContext ctx;
  setDeadline(ctx, o);
  coord::ListAgentsReply reply;
  grpc::Status s = coordinatorStub(o)->ListAgents(&ctx, coord::ListAgentsRequest(), &reply);
  if (!s.ok()) return fail(err, "coordinator", o.coordinator, s);
  out << (o.json ? toJson(reply).dump(2) + "\n" : renderCoordinatorAgents(reply));
  return 0;
}

int cmdJob(const KoloCliOptions& o, const std::string& job_id, std::ostream& out, std::ostream& err) {
  grpc::ClientContext ctx;
  setDeadline(ctx, o);
  agentrpc::GetJobRequest req;
  req.set_job_id(job_id);
  agentrpc::JobInfo reply;
  grpc::Status s = agentStub(o)->GetJob(&ctx, req, &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s);
  out << (o.json ? toJson(reply).dump(2) + "\n" : renderAgentJob(reply));
  return 0;
}

int cmdTimelineStart(const KoloCliOptions& o, const std::string& path, bool mark_cycles, std::ostream& out,
                     std::ostream& err) {
  grpc::ClientContext ctx;
  setDeadline(ctx, o);
  agentrpc::TimelineRequest req;
  req.set_start(true);
  // The agent runs elsewhere (another working directory): send an absolute path.
  std::error_code ec;
  auto abs = std::filesystem::absolute(path, ec);
  req.set_path(ec ? path : abs.string());
  req.set_mark_cycles(mark_cycles);
  agentrpc::TimelineReply reply;
  grpc::Status s = agentStub(o)->Timeline(&ctx, req, &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s);
  std::string written = reply.path().empty() ? req.path() : reply.path();
  if (o.json) {
    out << nlohmann::json{{"timeline", "started"}, {"path", written}}.dump(2) << "\n";
  } else {
    out << "timeline started: " << written << "\n";
  }
  return 0;
}

int cmdTimelineStop(const KoloCliOptions& o, std::ostream& out, std::ostream& err) {
  grpc::ClientContext ctx;
  setDeadline(ctx, o);
  agentrpc::TimelineRequest req;
  req.set_start(false);
  agentrpc::TimelineReply reply;
  grpc::Status s = agentStub(o)->Timeline(&ctx, req, &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s);
  if (o.json) {
    out << nlohmann::json{{"timeline", "stopped"}, {"path", reply.path()}}.dump(2) << "\n";
  } else {
    out << "timeline stopped" << (reply.path().empty() ? "" : ": " + reply.path()) << "\n";
  }
  return 0;
}

int cmdDrain(const KoloCliOptions& o, std::ostream& out, std::ostream& err) {
  grpc::ClientContext ctx;
  setDeadline(ctx, o);
  agentrpc::DrainReply reply;
  grpc::Status s = agentStub(o)->Drain(&ctx, agentrpc::DrainRequest(), &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s);
  if (o.json) {
    out << nlohmann::json{{"agent", o.agent}, {"draining", true}}.dump(2) << "\n";
  } else {
    out << "the kolo agent at " << o.agent << " is draining: it takes no new jobs\n";
  }
  return 0;
}

}  // namespace kolo::cli
