#include "coordinator/ha/etcd_client.h"

#include <fmt/format.h>

#include <thread>

#include "common/log.h"

namespace kolo::coordinator::ha {

namespace {

std::chrono::system_clock::time_point deadlineIn(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

bool retryable(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

StatusOr<std::vector<std::string>> parseEndpoints(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string e = text.substr(start, comma - start);
    // Accept http:// (etcdctl's form); TLS is not supported.
    if (e.rfind("http://", 0) == 0) e = e.substr(7);
    if (e.rfind("https://", 0) == 0) {
      return invalidArgument("--etcd-endpoints: '" + e +
                             "': TLS to etcd is not supported (use plain host:port)");
    }
    auto colon = e.rfind(':');
    if (e.empty() || colon == std::string::npos || colon == 0 || colon + 1 == e.size()) {
      return invalidArgument("--etcd-endpoints: '" + e + "' is not host:port (in '" + text + "')");
    }
    out.push_back(e);
    start = comma + 1;
  }
  if (out.empty()) return invalidArgument("--etcd-endpoints is empty");
  return out;
}

std::string prefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {
  for (const std::string& address : options_.endpoints) {
    grpc::ChannelArguments args;
    // Reconnect fast after etcd restarts (gRPC's default backoff grows to 120 s).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // A load reads every record at once: no 4 MiB cap on answers.
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);
    Endpoint e;
    e.address = address;
    e.channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    e.kv = etcdserverpb::KV::NewStub(e.channel);
    e.lease = etcdserverpb::Lease::NewStub(e.channel);
    e.watch = etcdserverpb::Watch::NewStub(e.channel);
    endpoints_.push_back(std::move(e));
  }
}

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::create(EtcdOptions options) {
  if (options.endpoints.empty()) return invalidArgument("no etcd endpoints");
  if (options.call_timeout.count() <= 0) options.call_timeout = std::chrono::milliseconds(2000);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options)));
}

std::string EtcdClient::endpointsText() const {
  std::string s;
  for (const auto& e : endpoints_) s += (s.empty() ? "" : ",") + e.address;
  return s;
}

template <typename Fn>
Status EtcdClient::callAny(const char* what, Fn call, std::chrono::milliseconds timeout) {
  // `timeout` bounds the whole call: each endpoint tried gets a share of
  // what is left (an unresponsive one must not use up the others' time).
  auto until = std::chrono::system_clock::now() + timeout;
  size_t first = current_.load();
  grpc::Status last(grpc::StatusCode::DEADLINE_EXCEEDED, "no time left");
  std::string last_address = endpoints_[first % endpoints_.size()].address;
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    auto now = std::chrono::system_clock::now();
    if (now >= until) break;
    size_t index = (first + i) % endpoints_.size();
    Endpoint& e = endpoints_[index];
    grpc::ClientContext ctx;
    std::chrono::system_clock::duration share =
        (until - now) / static_cast<int64_t>(endpoints_.size() - i);
    share = std::max<std::chrono::system_clock::duration>(share, std::chrono::milliseconds(100));
    ctx.set_deadline(std::min(until, now + share));
    last = call(e, &ctx);
    last_address = e.address;
    if (last.ok()) {
      current_.store(index);
      return okStatus();
    }
    if (!retryable(last)) break;
  }
  std::string message = fmt::format("etcd {} at {}: {} ({})", what, last_address,
                                    last.error_message(), static_cast<int>(last.error_code()));
  if (retryable(last)) return unavailable(message);
  return internalError(message);
}

Status EtcdClient::waitReachable(std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  Status last;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    etcdserverpb::RangeRequest req;
    req.set_key("/kolo-ping");
    req.set_count_only(true);
    last = callAny(
        "Range",
        [&](Endpoint& e, grpc::ClientContext* ctx) {
          ctx->set_wait_for_ready(true);  // wait for a connection within the deadline
          etcdserverpb::RangeResponse resp;
          return e.kv->Range(ctx, req, &resp);
        },
        std::min(left, options_.call_timeout));
    if (last.isOk()) return okStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return unavailable(fmt::format("cannot reach etcd at {} within {} ms: {}", endpointsText(),
                                 timeout.count(), last.message()));
}

StatusOr<etcdserverpb::RangeResponse> EtcdClient::range(const std::string& key,
                                                        const std::string& range_end) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  if (!range_end.empty()) req.set_range_end(range_end);
  etcdserverpb::RangeResponse resp;
  RETURN_IF_ERROR(callAny(
      "Range", [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Range(ctx, req, &resp); },
      options_.call_timeout));
  return resp;
}

StatusOr<etcdserverpb::TxnResponse> EtcdClient::txn(const etcdserverpb::TxnRequest& request) {
  etcdserverpb::TxnResponse resp;
  RETURN_IF_ERROR(callAny(
      "Txn", [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Txn(ctx, request, &resp); },
      options_.call_timeout));
  return resp;
}

StatusOr<etcdserverpb::DeleteRangeResponse> EtcdClient::deleteRange(const std::string& key,
                                                                    const std::string& range_end) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(key);
  if (!range_end.empty()) req.set_range_end(range_end);
  etcdserverpb::DeleteRangeResponse resp;
  RETURN_IF_ERROR(callAny(
      "DeleteRange",
      [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->DeleteRange(ctx, req, &resp); },
      options_.call_timeout));
  return resp;
}

StatusOr<etcdserverpb::PutResponse> EtcdClient::put(const std::string& key,
                                                    const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  RETURN_IF_ERROR(callAny(
      "Put", [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Put(ctx, req, &resp); },
      options_.call_timeout));
  return resp;
}

StatusOr<EtcdClient::Lease> EtcdClient::leaseGrant(int64_t ttl_s) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  RETURN_IF_ERROR(callAny(
      "LeaseGrant",
      [&](Endpoint& e, grpc::ClientContext* ctx) { return e.lease->LeaseGrant(ctx, req, &resp); },
      options_.call_timeout));
  if (!resp.error().empty()) return internalError("etcd LeaseGrant: " + resp.error());
  return Lease{resp.id(), resp.ttl()};
}

StatusOr<int64_t> EtcdClient::leaseKeepAlive(int64_t id, std::chrono::milliseconds timeout) {
  int64_t ttl = 0;
  RETURN_IF_ERROR(callAny(
      "LeaseKeepAlive",
      [&](Endpoint& e, grpc::ClientContext* ctx) {
        auto stream = e.lease->LeaseKeepAlive(ctx);
        etcdserverpb::LeaseKeepAliveRequest req;
        req.set_id(id);
        etcdserverpb::LeaseKeepAliveResponse resp;
        if (stream->Write(req) && stream->Read(&resp)) {
          ttl = resp.ttl();
          stream->WritesDone();
          ctx->TryCancel();
          stream->Finish();
          return grpc::Status::OK;
        }
        stream->WritesDone();
        grpc::Status st = stream->Finish();
        if (st.ok()) st = grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream closed");
        return st;
      },
      std::min(timeout, options_.call_timeout)));
  return ttl;
}

Status EtcdClient::leaseRevoke(int64_t id) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  return callAny(
      "LeaseRevoke",
      [&](Endpoint& e, grpc::ClientContext* ctx) { return e.lease->LeaseRevoke(ctx, req, &resp); },
      options_.call_timeout);
}

StatusOr<bool> EtcdClient::waitDeleted(const std::string& key, int64_t from_revision,
                                       std::chrono::milliseconds timeout,
                                       WatchCanceller* canceller) {
  Endpoint& e = endpoints_[current_.load() % endpoints_.size()];
  grpc::ClientContext ctx;
  ctx.set_deadline(deadlineIn(timeout));
  if (canceller != nullptr && !canceller->attach(&ctx)) return false;
  struct Detach {
    WatchCanceller* c;
    ~Detach() {
      if (c != nullptr) c->detach();
    }
  } detach{canceller};
  auto stream = e.watch->Watch(&ctx);
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(key);
  create->set_start_revision(from_revision);
  create->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  bool deleted = false;
  bool ended = false;  // the watch was canceled or compacted: the caller re-reads
  if (stream->Write(req)) {
    etcdserverpb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (resp.canceled() || resp.compact_revision() > 0) {
        ended = true;
        break;
      }
      for (const auto& ev : resp.events()) {
        if (ev.type() == mvccpb::Event::DELETE) deleted = true;
      }
      if (deleted) break;
    }
  }
  ctx.TryCancel();
  grpc::Status st = stream->Finish();
  if (deleted) return true;
  if (ended) {
    return unavailable(
        fmt::format("etcd Watch at {}: the watch of {} was canceled or compacted", e.address, key));
  }
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || st.ok() ||
      st.error_code() == grpc::StatusCode::CANCELLED) {
    return false;
  }
  current_.store((current_.load() + 1) % endpoints_.size());
  return unavailable(fmt::format("etcd Watch at {}: {}", e.address, st.error_message()));
}

}  // namespace kolo::coordinator::ha
