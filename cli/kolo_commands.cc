#include "cli/kolo_commands.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "cli/status_format.h"
#include "common/config_grpc.h"
#include "common/coord_endpoints.h"
#include "common/fd.h"
#include "common/tcp_probe.h"
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

// Why a daemon could not be reached: a TLS hint only when something
// accepts TCP connections there (then a handshake may be what failed);
// otherwise what connecting said. Addresses with a gRPC scheme
// (dns:///..., unix:...) keep the TLS hint.
std::string unreachableHint(const std::string& address, const GrpcClientSecurity& sec,
                            const std::string& flags) {
  if (address.find('/') != std::string::npos || address.rfind("unix:", 0) == 0)
    return tlsHint(sec, flags);
  const int e = tcpConnectError(address, std::chrono::milliseconds(500));
  if (e == 0) return tlsHint(sec, flags);
  if (e == EHOSTUNREACH || e == EINVAL) {  // EINVAL: no port in the address
    return " (nothing answers at " + address +
           ": the name does not resolve or the host is unreachable; check --" + flags + ")";
  }
  return " (nothing is listening at " + address + ": " + std::strerror(e) + "; is kolo-" + flags +
         " running there? check --" + flags + ")";
}

// Prints why a call failed and returns the exit code (1). `flags`: the
// prefix of the TLS flags for this daemon, for the hint.
int fail(std::ostream& err, const std::string& daemon, const std::string& address, const grpc::Status& s,
         const GrpcClientSecurity& sec, const std::string& flags) {
  std::string msg;
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      msg = "cannot reach the kolo " + daemon + " at " + address + ": " + s.error_message() +
            unreachableHint(address, sec, flags);
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      msg = "the kolo " + daemon + " at " + address + " refused the call: " + s.error_message() +
            (sec.token.empty() ? " (give the token with --" + flags + "-token-file or KOLO_" +
                                     (flags == "agent" ? std::string("AGENT") : std::string("COORDINATOR")) + "_TOKEN)"
                               : " (check the token)");
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

// The deadline and the bearer token of one call.
void prepare(grpc::ClientContext& ctx, const KoloCliOptions& o, const GrpcClientSecurity& sec) {
  ctx.set_deadline(std::chrono::system_clock::now() + o.deadline);
  addBearerToken(ctx, sec);
}

std::unique_ptr<agentrpc::Agent::Stub> agentStub(const KoloCliOptions& o) {
  return agentrpc::Agent::NewStub(makeSecureChannel(o.agent, o.agent_security));
}

using CoordRpc = std::function<grpc::Status(coord::Coordinator::Stub&, grpc::ClientContext&)>;

// One read-only call to the coordinator. With several addresses
// (`--coordinator A,B`) a try that fails with UNAVAILABLE (nothing there, a
// standby) goes to the leader it named or the next address, each address
// at most twice, all within o.deadline; 0 or the exit code, the failure
// printed naming every address tried.
int callCoordinator(const KoloCliOptions& o, std::ostream& err, const CoordRpc& rpc) {
  auto list = parseCoordinatorList(o.coordinator, "--coordinator");
  if (!list.isOk()) {
    err << "kolo: " << list.status().message() << "\n";
    return 2;
  }
  CoordEndpoints endpoints(list.value());
  const auto deadline = std::chrono::system_clock::now() + o.deadline;
  std::map<std::string, std::string> errors;
  grpc::Status s;
  std::string address;
  for (size_t tries = 0; tries < 2 * endpoints.size(); ++tries) {
    address = endpoints.current();
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    addBearerToken(ctx, o.coordinator_security);
    auto stub = coord::Coordinator::NewStub(makeSecureChannel(address, o.coordinator_security));
    s = rpc(*stub, ctx);
    if (s.ok()) return 0;
    if (endpoints.size() == 1 || s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    errors[address] = s.error_message();
    auto next = endpoints.failed(address, s.error_message());
    if (std::chrono::system_clock::now() + next.wait >= deadline) break;
    std::this_thread::sleep_for(next.wait);
  }
  if (endpoints.size() == 1 || s.error_code() != grpc::StatusCode::UNAVAILABLE) {
    return fail(err, "coordinator", address, s, o.coordinator_security, "coordinator");
  }
  std::string why;
  for (const auto& a : endpoints.all()) {
    auto it = errors.find(a);
    why += (why.empty() ? "" : "; ") + a + ": " + (it == errors.end() ? "not tried" : it->second);
  }
  err << "kolo: cannot reach a kolo coordinator at any of " << endpoints.joined() << ": " << why
      << tlsHint(o.coordinator_security, "coordinator") << "\n";
  return 1;
}

int64_t nowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void defineSecurityKnobs(Config& c) {
  defineGrpcClientKnobs(c, "agent", "agent's status service");
  defineGrpcClientKnobs(c, "coordinator", "coordinator");
}

Status resolveSecurity(KoloCliOptions& o, const std::map<std::string, std::string>& flags,
                       const std::map<std::string, std::string>& env) {
  Config c("kolo");
  defineSecurityKnobs(c);
  std::vector<std::string> args = {"kolo"};
  for (const auto& [name, value] : flags) args.push_back("--" + name + "=" + value);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  // KOLO_CONFIG names the daemons' config file, whose other keys this
  // registry does not know: kolo reads flags and environment only.
  std::map<std::string, std::string> e = env;
  e.erase("KOLO_CONFIG");
  RETURN_IF_ERROR(c.loadWithEnv(static_cast<int>(argv.size()), argv.data(), e));
  ASSIGN_OR_RETURN(o.agent_security, grpcClientSecurityFrom(c, "agent"));
  ASSIGN_OR_RETURN(o.coordinator_security, grpcClientSecurityFrom(c, "coordinator"));
  if (o.agent_security.token.empty() && c.getString("agent-token-file").empty() &&
      ::access(kDefaultAgentTokenFile, R_OK) == 0) {
    ASSIGN_OR_RETURN(o.agent_security.token,
                     readTokenFile(kDefaultAgentTokenFile, kDefaultAgentTokenFile));
  }
  return okStatus();
}

int cmdStatus(const KoloCliOptions& o, std::ostream& out, std::ostream& err) {
  grpc::ClientContext ctx;
  prepare(ctx, o, o.agent_security);
  agentrpc::AgentStatus reply;
  grpc::Status s = agentStub(o)->GetStatus(&ctx, agentrpc::StatusRequest(), &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s, o.agent_security, "agent");
  out << (o.json ? toJson(reply).dump(2) + "\n" : renderAgentStatus(reply));
  return 0;
}

int cmdJobs(const KoloCliOptions& o, std::ostream& out, std::ostream& err) {
  coord::ListJobsReply reply;
  int rc = callCoordinator(o, err, [&](coord::Coordinator::Stub& stub, grpc::ClientContext& ctx) {
    return stub.ListJobs(&ctx, coord::ListJobsRequest(), &reply);
  });
  if (rc != 0) return rc;
  int64_t now = nowUnixMs();
  out << (o.json ? toJson(reply, now).dump(2) + "\n" : renderCoordinatorJobs(reply, now));
  return 0;
}

int cmdAgents(const KoloCliOptions& o, std::ostream& out, std::ostream& err) {
  coord::ListAgentsReply reply;
  int rc = callCoordinator(o, err, [&](coord::Coordinator::Stub& stub, grpc::ClientContext& ctx) {
    return stub.ListAgents(&ctx, coord::ListAgentsRequest(), &reply);
  });
  if (rc != 0) return rc;
  out << (o.json ? toJson(reply).dump(2) + "\n" : renderCoordinatorAgents(reply));
  return 0;
}

int cmdJob(const KoloCliOptions& o, const std::string& job_id, std::ostream& out, std::ostream& err) {
  grpc::ClientContext ctx;
  prepare(ctx, o, o.agent_security);
  agentrpc::GetJobRequest req;
  req.set_job_id(job_id);
  agentrpc::JobInfo reply;
  grpc::Status s = agentStub(o)->GetJob(&ctx, req, &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s, o.agent_security, "agent");
  out << (o.json ? toJson(reply).dump(2) + "\n" : renderAgentJob(reply));
  return 0;
}

int cmdTimelineStart(const KoloCliOptions& o, const std::string& path, bool mark_cycles, std::ostream& out,
                     std::ostream& err) {
  grpc::ClientContext ctx;
  prepare(ctx, o, o.agent_security);
  agentrpc::TimelineRequest req;
  req.set_start(true);
  // As given: the agent takes a relative name inside its --timeline-dir
  // and refuses anything outside that directory.
  req.set_path(path);
  req.set_mark_cycles(mark_cycles);
  agentrpc::TimelineReply reply;
  grpc::Status s = agentStub(o)->Timeline(&ctx, req, &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s, o.agent_security, "agent");
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
  prepare(ctx, o, o.agent_security);
  agentrpc::TimelineRequest req;
  req.set_start(false);
  agentrpc::TimelineReply reply;
  grpc::Status s = agentStub(o)->Timeline(&ctx, req, &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s, o.agent_security, "agent");
  if (o.json) {
    out << nlohmann::json{{"timeline", "stopped"}, {"path", reply.path()}}.dump(2) << "\n";
  } else {
    out << "timeline stopped" << (reply.path().empty() ? "" : ": " + reply.path()) << "\n";
  }
  return 0;
}

int cmdDrain(const KoloCliOptions& o, int wait_s, std::ostream& out, std::ostream& err) {
  auto stub = agentStub(o);
  {
    grpc::ClientContext ctx;
    prepare(ctx, o, o.agent_security);
    agentrpc::DrainReply reply;
    grpc::Status s = stub->Drain(&ctx, agentrpc::DrainRequest(), &reply);
    if (!s.ok()) return fail(err, "agent", o.agent, s, o.agent_security, "agent");
  }
  int jobs_left = -1;
  if (wait_s > 0) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::seconds(wait_s);
    for (;;) {
      grpc::ClientContext ctx;
      prepare(ctx, o, o.agent_security);
      ctx.set_deadline(std::chrono::system_clock::now() + o.deadline);
      agentrpc::AgentStatus st;
      grpc::Status s = stub->GetStatus(&ctx, agentrpc::StatusRequest(), &st);
      if (!s.ok()) return fail(err, "agent", o.agent, s, o.agent_security, "agent");
      jobs_left = st.jobs_size();
      if (jobs_left == 0 || std::chrono::steady_clock::now() >= deadline) break;
      // Polling: the agent has no call that waits for its jobs to end.
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          std::chrono::milliseconds(500), deadline - std::chrono::steady_clock::now()));
    }
  }
  if (o.json) {
    nlohmann::json j{{"agent", o.agent}, {"draining", true}};
    if (jobs_left >= 0) j["jobs_left"] = jobs_left;
    out << j.dump(2) << "\n";
  } else {
    out << "the kolo agent at " << o.agent << " is draining: it takes no new jobs\n";
    if (jobs_left == 0) out << "no jobs left on it\n";
  }
  if (jobs_left > 0) {
    err << "kolo: " << jobs_left << " job(s) still running on the agent at " << o.agent << " after "
        << wait_s << " s (--wait)\n";
    return 1;
  }
  return 0;
}

int cmdUndrain(const KoloCliOptions& o, std::ostream& out, std::ostream& err) {
  grpc::ClientContext ctx;
  prepare(ctx, o, o.agent_security);
  agentrpc::UndrainReply reply;
  grpc::Status s = agentStub(o)->Undrain(&ctx, agentrpc::UndrainRequest(), &reply);
  if (!s.ok()) return fail(err, "agent", o.agent, s, o.agent_security, "agent");
  if (o.json) {
    out << nlohmann::json{{"agent", o.agent}, {"draining", false}}.dump(2) << "\n";
  } else {
    out << "the kolo agent at " << o.agent << " takes new jobs again\n";
  }
  return 0;
}

}  // namespace kolo::cli
