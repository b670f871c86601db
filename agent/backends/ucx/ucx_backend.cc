// The UCX transport of the p2p backend (p2p_backend.h): one UCP context, one
// worker and one endpoint per peer, driven by the backend's progress thread.
// Messages are UCX tagged messages; the 64-bit tag is
//   seq (16) | sender rank (16) | step (16) | chunk (16)
// UCX picks its transports (tcp, shared memory, RDMA; UCX_TLS narrows them).
#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "agent/backends/kv_store.h"
#include "agent/backends/p2p_backend.h"
#include "agent/backends/ucx/factory.h"

namespace kolo {
namespace {

ucp_tag_t makeTag(uint64_t seq, int src, uint32_t step, uint32_t chunk) {
  return ((seq & 0xffff) << 48) | ((static_cast<uint64_t>(src) & 0xffff) << 32) |
         ((static_cast<uint64_t>(step) & 0xffff) << 16) | (chunk & 0xffff);
}
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

std::string ucsText(ucs_status_t s) { return ucs_status_string(s); }

Status notViable(const std::string& what, ucs_status_t s) {
  return unavailable("not viable: " + what + ": " + ucsText(s));
}

// What to do when no transport reaches a peer (issue 45).
std::string unreachableHint() {
  const char* tls = std::getenv("UCX_TLS");
  const char* dev = std::getenv("UCX_NET_DEVICES");
  return std::string(
             ". The two agents share no UCX transport that connects them: give both "
             "the same UCX_TLS (tcp always works between hosts; this agent has ") +
         (tls != nullptr ? std::string("UCX_TLS=") + tls : "no UCX_TLS") + ", " +
         (dev != nullptr ? std::string("UCX_NET_DEVICES=") + dev : "no UCX_NET_DEVICES") +
         "), name in UCX_NET_DEVICES an interface both hosts have, and check that the hosts "
         "reach each other on it (`ucx_info -d` lists the transports)";
}

class UcxTransport;

struct PeerArg {
  UcxTransport* owner;
  int rank;
};

// The ucx transport's own options: UCX over TCP, the size of the segments
// UCX sends and receives (bytes; 0 keeps UCX's own default). A UCX_TCP_
// TX/RX_SEG_SIZE variable in the agent's environment wins over these.
struct UcxTransportOptions {
  size_t tcp_tx_seg_bytes = 0;
  size_t tcp_rx_seg_bytes = 0;
};

class UcxTransport final : public P2pTransport {
 public:
  UcxTransport(P2pHost& host, UcxTransportOptions options)
      : P2pTransport(host), ucx_(options) {}

  std::string_view name() const override { return "ucx"; }

 private:
  Status connectTransport(KvStore& kv, Clock::time_point deadline) override {
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return notViable("reading the UCX configuration", s);
    // TCP segment sizes (BackendOptions): a UCX_ variable the user set wins.
    // UCP keeps transport-level keys it does not know and applies them to
    // each transport's configuration (only tcp has these two); it warns
    // when no transport took them, so they are left out when UCX_TLS
    // selects transports without tcp.
    const char* tls = std::getenv("UCX_TLS");
    const std::string tls_list = tls == nullptr ? "" : tls;
    const bool tcp_possible = tls_list.empty() || tls_list == "all" || tls_list[0] == '^' ||
                              tls_list.find("tcp") != std::string::npos;
    using Seg = std::pair<const char*, size_t>;
    for (auto [key, bytes] :
         {Seg{"TX_SEG_SIZE", ucx_.tcp_tx_seg_bytes}, Seg{"RX_SEG_SIZE", ucx_.tcp_rx_seg_bytes}}) {
      if (!tcp_possible || bytes == 0 || std::getenv((std::string("UCX_TCP_") + key).c_str()) != nullptr) continue;
      s = ucp_config_modify(config, key, std::to_string(bytes).c_str());
      if (s != UCS_OK) log()->warn("{}cannot set UCX {}={}: {}", prefix(), key, bytes, ucs_status_string(s));
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.name = "kolo-agent";
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) {
      context_ = nullptr;
      return notViable("ucp_init", s);
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) {
      worker_ = nullptr;
      return notViable("ucp_worker_create", s);
    }
    s = ucp_worker_get_efd(worker_, &worker_efd_);
    if (s != UCS_OK) return notViable("ucp_worker_get_efd (no transport with wake-up support)", s);

    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    s = ucp_worker_get_address(worker_, &addr, &addr_len);
    if (s != UCS_OK) return notViable("ucp_worker_get_address", s);
    std::string blob(reinterpret_cast<const char*>(addr), addr_len);
    ucp_worker_release_address(worker_, addr);
    RETURN_IF_ERROR(kv.put(key(opts().rank), blob).withContext("publishing the UCX address"));

    const int n = opts().size;
    eps_.assign(n, nullptr);
    for (int p = 0; p < n; ++p) peer_args_.push_back(std::make_unique<PeerArg>(PeerArg{this, p}));
    for (int p = 0; p < n; ++p) {
      if (p == opts().rank) continue;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      auto remote = kv.get(key(p), std::max(left, std::chrono::milliseconds(1)));
      if (!remote.isOk()) {
        return peerFailure("agent rank " + std::to_string(p) + " unreachable: its UCX address '" +
                           key(p) + "' did not appear: " + remote.status().message());
      }
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(remote->data());
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &UcxTransport::onEndpointError;
      ep.err_handler.arg = peer_args_[p].get();
      s = ucp_ep_create(worker_, &ep, &eps_[p]);
      if (s != UCS_OK) {
        eps_[p] = nullptr;
        Status st = notViable("no UCX transport reaches agent rank " + std::to_string(p), s);
        return Status(st.code(), st.message() + unreachableHint());
      }
    }
    return okStatus();
  }

  int transportFd() const override { return worker_efd_; }

  bool progressTransport() override { return ucp_worker_progress(worker_) != 0; }

  bool armTransport(int&) override {
    ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) return false;
    if (s != UCS_OK) log()->warn("{}ucp_worker_arm: {}", prefix(), ucsText(s));
    return true;
  }

  void postSend(P2pRequest* r, const void* buf, size_t bytes) override {
    if (eps_[r->peer] == nullptr) return fail(r, UCS_ERR_NOT_CONNECTED);
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = &UcxTransport::onSendDone;
    prm.user_data = r;
    track(r, ucp_tag_send_nbx(eps_[r->peer], buf, bytes,
                              makeTag(r->seq, opts().rank, r->step, r->chunk), &prm));
  }

  void postRecv(P2pRequest* r, void* buf, size_t bytes) override {
    ucp_request_param_t prm{};
    // UCX 1.13 leaves recv_info unset when a receive completes at once from
    // the unexpected queue, so always take the callback: it carries the length.
    prm.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    prm.cb.recv = &UcxTransport::onRecvDone;
    prm.user_data = r;
    track(r, ucp_tag_recv_nbx(worker_, buf, bytes, makeTag(r->seq, r->peer, r->step, r->chunk),
                              kFullMask, &prm));
  }

  // Cancels posted receives (they complete with UCS_ERR_CANCELED) and drops
  // every endpoint (outstanding sends complete with an error).
  void closeTransportForcefully() override {
    forEachRequest([this](P2pRequest& r) {
      if (r.is_recv && r.handle != nullptr) ucp_request_cancel(worker_, r.handle);
    });
    for (auto& ep : eps_) {
      if (ep == nullptr) continue;
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
      ep = nullptr;
    }
  }

  void teardownTransport(bool force, Clock::time_point deadline) override {
    if (worker_ != nullptr) {
      std::vector<void*> closing;
      for (int p = 0; p < static_cast<int>(eps_.size()); ++p) {
        if (eps_[p] == nullptr) continue;
        ucp_request_param_t prm{};
        if (force || peerFailed(p)) {
          prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
          prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
        }
        ucs_status_ptr_t r = ucp_ep_close_nbx(eps_[p], &prm);
        if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
        eps_[p] = nullptr;
      }
      forEachRequest([this](P2pRequest& r) {
        if (r.is_recv && r.handle != nullptr) ucp_request_cancel(worker_, r.handle);
      });
      auto pending = [&] {
        return std::any_of(closing.begin(), closing.end(),
                           [](void* r) { return ucp_request_check_status(r) == UCS_INPROGRESS; });
      };
      while (pending() && Clock::now() < deadline) {
        if (ucp_worker_progress(worker_) != 0) continue;
        if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
        pollfd pfd{worker_efd_, POLLIN, 0};
        ::poll(&pfd, 1, 10);
      }
      if (pending())
        log()->warn("{}closing the UCX endpoints timed out; destroying the worker", prefix());
      for (void* r : closing) ucp_request_free(r);
      ucp_worker_destroy(worker_);
      worker_ = nullptr;
    }
    if (context_ != nullptr) {
      ucp_cleanup(context_);
      context_ = nullptr;
    }
  }

  // --- completions (progress thread, inside ucp_worker_progress & co) -------

  void fail(P2pRequest* r, ucs_status_t s) {
    r->result = s == UCS_ERR_MESSAGE_TRUNCATED ? P2pRequest::Result::kTruncated
                                               : P2pRequest::Result::kError;
    r->error = ucsText(s);
    r->handle = nullptr;
    completed(r);
  }

  void finish(P2pRequest* r, ucs_status_t s) {
    if (s != UCS_OK) return fail(r, s);
    r->result = P2pRequest::Result::kOk;
    r->handle = nullptr;
    completed(r);
  }

  void track(P2pRequest* r, ucs_status_ptr_t sp) {
    if (sp == nullptr) {
      finish(r, UCS_OK);
    } else if (UCS_PTR_IS_ERR(sp)) {
      fail(r, UCS_PTR_STATUS(sp));
    } else if (r->result == P2pRequest::Result::kPending) {
      r->handle = sp;
    }  // else the callback already ran (and freed the request) inside the call
  }

  static void onSendDone(void* request, ucs_status_t status, void* user_data) {
    auto* r = static_cast<P2pRequest*>(user_data);
    ucp_request_free(request);
    owner(r)->finish(r, status);
  }

  static void onRecvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                         void* user_data) {
    auto* r = static_cast<P2pRequest*>(user_data);
    if (info != nullptr) r->received = info->length;
    ucp_request_free(request);
    owner(r)->finish(r, status);
  }

  static void onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* pa = static_cast<PeerArg*>(arg);
    pa->owner->peerGone(pa->rank, ucsText(status));
  }

  static UcxTransport* owner(P2pRequest* r) { return static_cast<UcxTransport*>(r->transport); }

  const UcxTransportOptions ucx_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_efd_ = -1;
  std::vector<ucp_ep_h> eps_;
  std::vector<std::unique_ptr<PeerArg>> peer_args_;
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> createUcxBackend(const BackendOptions& options, KvStore& kv) {
  UcxTransportOptions ucx{options.ucx_tcp_tx_seg_bytes, options.ucx_tcp_rx_seg_bytes};
  return makeP2pBackend(options, kv, "agent.backend.ucx", [ucx](P2pHost& host) {
    return std::make_unique<UcxTransport>(host, ucx);
  });
}

}  // namespace kolo
