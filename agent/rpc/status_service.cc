#include "agent/rpc/status_service.h"

#include "agent/agent.h"
#include "agent/rpc/admin_auth.h"
#include "common/config_grpc.h"
#include "common/log.h"
#include "kolo/proto/agent.grpc.pb.h"

namespace kolo {
namespace {

constexpr auto kLoopTimeout = std::chrono::seconds(2);

grpc::Status loopTimeout(const Status& st) {
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, st.message());
}

class StatusService final : public agentrpc::Agent::Service {
 public:
  explicit StatusService(kolo::Agent& a) : agent_(a), token_(a.options().rpc_security.token) {}

  grpc::Status GetStatus(grpc::ServerContext* ctx, const agentrpc::StatusRequest*,
                         agentrpc::AgentStatus* out) override {
    auto r = agent_.loop().call<agentrpc::AgentStatus>([this] { return agent_.statusOnLoop(); }, kLoopTimeout);
    if (!r.isOk()) return loopTimeout(r.status());
    *out = std::move(r.value());
    // Which processes of which users train here is for the agent's admins:
    // with a token configured, only a call that carries it sees them.
    if (!token_.empty() &&
        !checkAdminCall("GetStatus", token_, authorization(*ctx), ctx->peer()).ok()) {
      for (auto& c : *out->mutable_clients()) {
        c.set_pid(0);
        c.set_own_pid(0);
        c.set_uid(0);
      }
      out->set_pids_hidden(true);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext*, const agentrpc::ListJobsRequest*,
                        agentrpc::ListJobsReply* out) override {
    auto r = agent_.loop().call<agentrpc::ListJobsReply>([this] { return agent_.listJobsOnLoop(); },
                                                         kLoopTimeout);
    if (!r.isOk()) return loopTimeout(r.status());
    *out = std::move(r.value());
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const agentrpc::GetJobRequest* req,
                      agentrpc::JobInfo* out) override {
    std::string id = req->job_id();
    auto r = agent_.loop().call<std::optional<agentrpc::JobInfo>>(
        [this, id]() -> std::optional<agentrpc::JobInfo> {
          const Job* j = agent_.findJobOnLoop(id);
          if (j == nullptr) return std::nullopt;
          return agent_.jobInfoOnLoop(*j);
        },
        kLoopTimeout);
    if (!r.isOk()) return loopTimeout(r.status());
    if (!r.value().has_value()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job '" + id + "' on this agent");
    }
    *out = std::move(*r.value());
    return grpc::Status::OK;
  }

  grpc::Status Timeline(grpc::ServerContext* ctx, const agentrpc::TimelineRequest* req,
                        agentrpc::TimelineReply* out) override {
    if (grpc::Status a = authorize(*ctx, "Timeline"); !a.ok()) return a;
    auto r = agent_.loop().call<StatusOr<std::string>>(
        [this, req] { return agent_.timelineOnLoop(req->start(), req->path(), req->mark_cycles()); }, kLoopTimeout);
    if (!r.isOk()) return loopTimeout(r.status());
    if (!r.value().isOk()) {
      // A name outside --timeline-dir is PERMISSION_DENIED; the rest (already
      // recording, the directory missing) FAILED_PRECONDITION.
      const Status& st = r.value().status();
      grpc::StatusCode code =
          st.code() == Code::kPermissionDenied  ? grpc::StatusCode::PERMISSION_DENIED
          : st.code() == Code::kInvalidArgument ? grpc::StatusCode::INVALID_ARGUMENT
                                                : grpc::StatusCode::FAILED_PRECONDITION;
      return grpc::Status(code, st.message());
    }
    out->set_path(r.value().value());
    return grpc::Status::OK;
  }

  grpc::Status Metrics(grpc::ServerContext*, const agentrpc::MetricsRequest*, agentrpc::MetricsReply* out) override {
    out->set_text(agent_.metricsText());  // the registry is thread-safe
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext* ctx, const agentrpc::DrainRequest*, agentrpc::DrainReply*) override {
    if (grpc::Status a = authorize(*ctx, "Drain"); !a.ok()) return a;
    auto r = agent_.loop().call<bool>(
        [this] {
          agent_.drainOnLoop();
          return true;
        },
        kLoopTimeout);
    if (!r.isOk()) return loopTimeout(r.status());
    return grpc::Status::OK;
  }

  grpc::Status Undrain(grpc::ServerContext* ctx, const agentrpc::UndrainRequest*,
                       agentrpc::UndrainReply*) override {
    if (grpc::Status a = authorize(*ctx, "Undrain"); !a.ok()) return a;
    auto r = agent_.loop().call<bool>(
        [this] {
          agent_.undrainOnLoop();
          return true;
        },
        kLoopTimeout);
    if (!r.isOk()) return loopTimeout(r.status());
    return grpc::Status::OK;
  }

 private:
  // Drain, Undrain and Timeline: the token, or without one a loopback peer (admin_auth.h).
  static std::optional<std::string> authorization(const grpc::ServerContext& ctx) {
    const auto& md = ctx.client_metadata();
    if (auto it = md.find("authorization"); it != md.end()) {
      return std::string(it->second.data(), it->second.size());
    }
    return std::nullopt;
  }
  grpc::Status authorize(const grpc::ServerContext& ctx, const std::string& call) const {
    grpc::Status s = checkAdminCall(call, token_, authorization(ctx), ctx.peer());
    if (!s.ok()) log::get("agent.rpc")->warn("refused {} from {}: {}", call, ctx.peer(), s.error_message());
    return s;
  }

  kolo::Agent& agent_;
  const std::string token_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> statusServiceCredentials(const GrpcServerSecurity& s) {
  return makeServerCredentials(s);
}

std::unique_ptr<grpc::Service> makeStatusService(Agent& agent) {
  const AgentOptions& o = agent.options();
  const std::string host = o.rpc_listen.substr(0, o.rpc_listen.rfind(':'));
  const bool loopback =
      host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host.rfind("unix:", 0) == 0;
  if (!loopback && o.rpc_security.token.empty()) {
    auto lg = log::get("agent.rpc");
    lg->warn(
        "the status service listens on {} without --rpc-auth-token-file: other hosts may read "
        "the status, and Drain and Timeline are accepted from loopback only",
        o.rpc_listen);
  }
  return std::make_unique<StatusService>(agent);
}

}  // namespace kolo
