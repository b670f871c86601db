// The emulated communicator (emu_comm.h): bootstrap over loopback TCP and
// the collectives as point-to-point exchanges reduced on the host.
#include "agent/backends/nccl/emu/emu_comm.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "agent/backends/nccl/emu/emu_wire.h"
#include "common/reduce.h"

namespace kolo::nccl::emu {
namespace {

constexpr char kMagic[16] = "kolo-nccl-emu-1";

struct Hello {
  char magic[16];
  uint64_t nonce;
  int32_t rank;
  int32_t size;
  uint16_t port;
  uint16_t pad[3];
};

// ncclGetUniqueId's listeners, by nonce, until rank 0's init takes its own.
std::mutex& registryMu() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<uint64_t, UniqueFd>& registry() {
  static auto* r = new std::map<uint64_t, UniqueFd>;
  return *r;
}

int64_t faultAfter() {
  const char* f = std::getenv("KOLO_NCCL_EMU_FAULTS");
  if (f == nullptr) return -1;
  const char* key = "async-error-after=";
  const char* p = std::strstr(f, key);
  return p == nullptr ? -1 : std::atoll(p + std::strlen(key));
}

}  // namespace

Status makeUniqueId(ncclUniqueId* id) {
  uint16_t port = 0;
  ASSIGN_OR_RETURN(UniqueFd l, listenLoopback(&port));
  IdBytes b{};
  std::memcpy(b.magic, kMagic, sizeof(kMagic));
  b.nonce = (std::random_device{}() * uint64_t{0x9e3779b97f4a7c15}) ^
            static_cast<uint64_t>(::getpid()) ^ (uint64_t{port} << 48);
  b.port = port;
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, &b, sizeof(b));
  std::lock_guard<std::mutex> lock(registryMu());
  registry()[b.nonce] = std::move(l);
  return okStatus();
}

ncclResult_t resultOf(const Status& s) {
  switch (s.code()) {
    case Code::kOk:
      return ncclSuccess;
    case Code::kPeerFailure:
      return ncclRemoteError;
    case Code::kInvalidArgument:
      return ncclInvalidUsage;
    default:
      return ncclSystemError;
  }
}

Comm::~Comm() {
  aborted_ = true;
  if (init_.joinable()) init_.join();
}

void Comm::start(const ncclUniqueId& id) {
  IdBytes b;
  std::memcpy(&b, id.internal, sizeof(b));
  fault_after_ = faultAfter();
  init_ = std::thread([this, b] {
    Status s = bootstrap(b);
    if (s.isOk()) {
      state_ = ncclSuccess;
    } else {
      fail(resultOf(s), "bootstrap of rank " + std::to_string(rank_) + ": " + s.message());
    }
  });
}

void Comm::abort() {
  aborted_ = true;
  if (init_.joinable()) init_.join();
}

void Comm::fail(ncclResult_t r, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!last_error_.empty()) return;
  last_error_ = why;
  state_ = r;
}

std::string Comm::lastError() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

bool Comm::faultDue() {
  const int64_t n = ++collectives_;
  return fault_after_ >= 0 && n > fault_after_;
}

Status Comm::bootstrap(const IdBytes& id) {
  if (std::memcmp(id.magic, kMagic, sizeof(kMagic)) != 0)
    return invalidArgument("not a unique id of the NCCL emulation (made by libnccl?)");
  peers_.resize(size_);
  if (rank_ == 0) {
    std::vector<uint16_t> ports;
    RETURN_IF_ERROR(bootstrapRoot(id, &ports));
  } else {
    RETURN_IF_ERROR(bootstrapPeer(id));
  }
  fds_.assign(size_, -1);
  for (int p = 0; p < size_; ++p) fds_[p] = peers_[p].get();
  return okStatus();
}

// Rank 0: every other rank says hello on the id's listener; they get the
// table of everyone's listener ports back.
Status Comm::bootstrapRoot(const IdBytes& id, std::vector<uint16_t>* ports) {
  UniqueFd listener;
  {
    std::lock_guard<std::mutex> lock(registryMu());
    auto it = registry().find(id.nonce);
    if (it == registry().end())
      return invalidArgument(
          "rank 0 must run in the process that called ncclGetUniqueId for this id");
    listener = std::move(it->second);
    registry().erase(it);
  }
  auto cancelled = [this] { return aborted_.load(); };
  ports->assign(size_, 0);
  for (int got = 1; got < size_;) {
    ASSIGN_OR_RETURN(UniqueFd fd, acceptOne(listener.get(), cancelled));
    Hello h{};
    if (!recvAll(fd.get(), &h, sizeof(h), cancelled).isOk()) continue;  // a stray connection
    if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.nonce != id.nonce) continue;
    if (h.size != size_)
      return invalidArgument("rank " + std::to_string(h.rank) + " says the communicator has " +
                             std::to_string(h.size) + " ranks, rank 0 says " +
                             std::to_string(size_));
    if (h.rank <= 0 || h.rank >= size_ || peers_[h.rank].get() >= 0)
      return invalidArgument("rank " + std::to_string(h.rank) + " joined twice or is out of range");
    (*ports)[h.rank] = h.port;
    peers_[h.rank] = std::move(fd);
    ++got;
  }
  for (int p = 1; p < size_; ++p)
    RETURN_IF_ERROR(
        sendAll(peers_[p].get(), ports->data(), ports->size() * sizeof(uint16_t), cancelled));
  return okStatus();
}

// Rank i > 0: hello to rank 0, then a connection to every rank 0 < j < i,
// and one accepted from every rank j > i.
Status Comm::bootstrapPeer(const IdBytes& id) {
  auto cancelled = [this] { return aborted_.load(); };
  uint16_t my_port = 0;
  ASSIGN_OR_RETURN(UniqueFd listener, listenLoopback(&my_port));
  ASSIGN_OR_RETURN(peers_[0], connectLoopback(id.port, cancelled));
  Hello h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.nonce = id.nonce;
  h.rank = rank_;
  h.size = size_;
  h.port = my_port;
  RETURN_IF_ERROR(sendAll(peers_[0].get(), &h, sizeof(h), cancelled));
  std::vector<uint16_t> ports(size_);
  Status s = recvAll(peers_[0].get(), ports.data(), ports.size() * sizeof(uint16_t), cancelled);
  if (!s.isOk()) return peerFailure("rank 0 went away during the bootstrap: " + s.message());
  for (int j = 1; j < rank_; ++j) {
    ASSIGN_OR_RETURN(peers_[j], connectLoopback(ports[j], cancelled));
    RETURN_IF_ERROR(sendAll(peers_[j].get(), &h, sizeof(h), cancelled));
  }
  for (int got = rank_ + 1; got < size_;) {
    ASSIGN_OR_RETURN(UniqueFd fd, acceptOne(listener.get(), cancelled));
    Hello o{};
    if (!recvAll(fd.get(), &o, sizeof(o), cancelled).isOk()) continue;
    if (std::memcmp(o.magic, kMagic, sizeof(kMagic)) != 0 || o.nonce != id.nonce) continue;
    if (o.rank <= rank_ || o.rank >= size_ || peers_[o.rank].get() >= 0)
      return invalidArgument("rank " + std::to_string(o.rank) + " connected twice or out of order");
    peers_[o.rank] = std::move(fd);
    ++got;
  }
  return okStatus();
}

// --- collectives -------------------------------------------------------------

namespace {

using Buf = std::vector<std::byte>;

char* at(const void* p, size_t off) { return const_cast<char*>(static_cast<const char*>(p)) + off; }

void reduceInto(const Call& k, const std::vector<const void*>& srcs, void* out) {
  void* dsts[] = {out};
  reduceBlocks(k.dtype, k.op, srcs.data(), static_cast<int>(srcs.size()), dsts, 1, k.count, 1.0,
               1.0);
}

// One collective: its transfers, then the host reduction where it has one.
Status runCollective(Comm& c, const Call& k, const std::function<bool()>& cancelled) {
  const int me = c.rank(), n = c.size();
  const size_t bytes = k.count * dataTypeSize(k.dtype);
  std::vector<Transfer> sends, recvs;
  std::vector<Buf> tmp(n);
  std::vector<const void*> srcs(n);
  auto recvTmp = [&](int p) {
    tmp[p].resize(bytes);
    recvs.push_back({p, tmp[p].data(), bytes});
    srcs[p] = tmp[p].data();
  };
  switch (k.kind) {
    case Call::kAllReduce:
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        sends.push_back({p, at(k.in, 0), bytes});
        recvTmp(p);
      }
      srcs[me] = k.in;
      RETURN_IF_ERROR(exchange(c.fds(), me, sends, recvs, cancelled));
      if (bytes > 0) reduceInto(k, srcs, k.out);
      return okStatus();
    case Call::kReduceScatter:
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        sends.push_back({p, at(k.in, p * bytes), bytes});
        recvTmp(p);
      }
      srcs[me] = at(k.in, me * bytes);
      RETURN_IF_ERROR(exchange(c.fds(), me, sends, recvs, cancelled));
      if (bytes > 0) reduceInto(k, srcs, k.out);
      return okStatus();
    case Call::kReduce:
      if (me == k.peer) {
        for (int p = 0; p < n; ++p)
          if (p != me) recvTmp(p);
      } else {
        sends.push_back({k.peer, at(k.in, 0), bytes});
      }
      srcs[me] = k.in;
      RETURN_IF_ERROR(exchange(c.fds(), me, sends, recvs, cancelled));
      if (me == k.peer && bytes > 0) reduceInto(k, srcs, k.out);
      return okStatus();
    case Call::kBroadcast:
      if (me == k.peer) {
        for (int p = 0; p < n; ++p)
          if (p != me) sends.push_back({p, at(k.in, 0), bytes});
        if (bytes > 0 && k.in != k.out) std::memmove(k.out, k.in, bytes);
      } else {
        recvs.push_back({k.peer, k.out, bytes});
      }
      return exchange(c.fds(), me, sends, recvs, cancelled);
    case Call::kAllGather:
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        sends.push_back({p, at(k.in, 0), bytes});
        recvs.push_back({p, at(k.out, p * bytes), bytes});
      }
      if (bytes > 0 && k.in != at(k.out, me * bytes))
        std::memmove(at(k.out, me * bytes), k.in, bytes);
      return exchange(c.fds(), me, sends, recvs, cancelled);
    default:
      return internalError("not a collective");
  }
}

}  // namespace

Status runCalls(Comm& c, const std::vector<Call>& calls, const std::function<bool()>& cancelled) {
  size_t i = 0;
  while (i < calls.size()) {
    const Call& k = calls[i];
    if (k.kind != Call::kSend && k.kind != Call::kRecv) {
      RETURN_IF_ERROR(runCollective(c, k, cancelled));
      ++i;
      continue;
    }
    // Consecutive sends and receives progress together, as in one NCCL group.
    std::vector<Transfer> sends, recvs;
    for (; i < calls.size() && (calls[i].kind == Call::kSend || calls[i].kind == Call::kRecv);
         ++i) {
      const Call& p = calls[i];
      const size_t bytes = p.count * dataTypeSize(p.dtype);
      if (p.kind == Call::kSend)
        sends.push_back({p.peer, at(p.in, 0), bytes});
      else
        recvs.push_back({p.peer, p.out, bytes});
    }
    RETURN_IF_ERROR(exchange(c.fds(), c.rank(), sends, recvs, cancelled));
  }
  return okStatus();
}

}  // namespace kolo::nccl::emu
