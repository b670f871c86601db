#include "agent/cross/cross_job.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>

#include "agent/fusion/fusion_planner.h"
#include "agent/timeline/timeline.h"
#include "common/log.h"

namespace kolo {

namespace {
auto logger() { return log::get("agent.cross"); }
}  // namespace

void AgreedParams::encode(bool leader, uint8_t* out) const {
  if (!leader) {
    std::memset(out, 0xFF, kWireBytes);
    return;
  }
  auto put = [](uint8_t* p, uint64_t v) {
    v = std::min<uint64_t>(v, 0xFFFFFFFFu);
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  };
  put(out, (fusion_threshold_bytes + 1023) >> 10);
  put(out + 4, small_message_bytes);
  put(out + 8, (fusion_chunk_bytes + 1023) >> 10);
}

AgreedParams AgreedParams::decode(const uint8_t* in) {
  auto get = [](const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
  };
  AgreedParams a;
  a.fusion_threshold_bytes = get(in) << 10;
  a.small_message_bytes = get(in + 4);
  a.fusion_chunk_bytes = get(in + 8) << 10;
  return a;
}

CrossJob::CrossJob(std::string label, std::unique_ptr<Backend> backend, CrossJobOptions options,
                   EventLoop& loop, DoneOnLoop on_done)
    : label_(std::move(label)),
      backend_(std::move(backend)),
      state_(backend_->rank(), backend_->size(), options.cache_capacity),
      options_(options),
      loop_(loop),
      on_done_(std::move(on_done)) {
  agreed_.fusion_threshold_bytes = options_.fusion_threshold_bytes;
  agreed_.small_message_bytes = options_.small_message_bytes;
  agreed_.fusion_chunk_bytes = options_.fusion_chunk_bytes;
  if (options_.autotune && backend_->rank() == 0) {
    autotune::AutotuneOptions ao = *options_.autotune;
    ao.initial.fusion_threshold_mb = static_cast<double>(options_.fusion_threshold_bytes) / (1 << 20);
    ao.initial.switch_point_bytes = options_.small_message_bytes;
    // kolo never waits for a cycle (a name is negotiated as soon as it is
    // ready), so the cycle time is not a dimension worth searching.
    ao.fixed_cycle_time_ms = ao.initial.cycle_time_ms;
    auto made = autotune::Autotuner::create(std::move(ao));
    if (made.isOk()) {
      tuner_ = std::move(made.value());
      agreed_.fusion_threshold_bytes = tuner_->params().fusionThresholdBytes();
      agreed_.small_message_bytes = tuner_->params().switch_point_bytes;
      logger()->info("{}: autotune on: starting at fusion threshold {:.1f} MiB, switch point {} bytes", label_,
                     tuner_->params().fusion_threshold_mb, tuner_->params().switch_point_bytes);
    } else {
      logger()->warn("{}: autotune off: {}", label_, made.status().message());
    }
  }
  last_report_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] {
    log::setThreadName("negotiate");
    run();
  });
}

CrossJob::~CrossJob() {
  abort(aborted("the job's generation ended"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  backend_.reset();  // completes anything still queued with Aborted
}

void CrossJob::submit(CrossWork work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(work));
  }
  cv_.notify_all();
}

void CrossJob::abort(Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.isOk()) aborted_ = why;
  }
  backend_->abort(why);
  cv_.notify_all();
}

Status CrossJob::syncCollective(const std::function<void(Backend::Done)>& post) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  post([p](Status st) { p->set_value(std::move(st)); });
  // The backend bounds every collective by its own timeout; this is a backstop.
  if (f.wait_for(options_.collective_timeout + std::chrono::seconds(5)) != std::future_status::ready) {
    return timedOut("negotiation collective did not finish within " +
                    std::to_string(options_.collective_timeout.count()) + " ms");
  }
  return f.get();
}

void CrossJob::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Enter the next cycle at once when there is work (new or still
      // negotiating); otherwise tick every options_.idle_cycle so that peers waiting
      // on us never wait longer than that.
      cv_.wait_for(lock, options_.idle_cycle, [&] {
        return stop_ || !aborted_.isOk() || !incoming_.empty() || !waiting_.empty();
      });
      if (stop_ || !aborted_.isOk()) break;
      while (!incoming_.empty()) {
        CrossWork w = std::move(incoming_.front());
        incoming_.pop_front();
        state_.addLocal(w.req);
        std::string name = w.req.name;
        waiting_[name] = std::move(w);
      }
    }
    Status st = cycle();
    if (!st.isOk()) {
      logger()->warn("{}: negotiation failed: {}", label_, st.message());
      abort(st);
      break;
    }
  }
  // Fail whatever is still negotiating.
  Status why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = aborted_.isOk() ? aborted("the job's generation ended") : aborted_;
    for (auto& w : incoming_) waiting_[w.req.name] = std::move(w);
    incoming_.clear();
  }
  for (auto& [name, w] : waiting_) {
    loop_.post([cb = on_done_, name = name, why] { cb(name, why); });
  }
  waiting_.clear();
}

void CrossJob::applyAgreed(const AgreedParams& p) {
  if (p.small_message_bytes != agreed_.small_message_bytes) backend_->setSmallMessageBytes(p.small_message_bytes);
  agreed_ = p;
}

void CrossJob::measureForAutotune() {
  if (!tuner_ || tuner_->done()) return;
  const uint64_t done = allreduced_bytes_.load(std::memory_order_relaxed);
  if (done == reported_bytes_) return;  // nothing completed: idle time counts into the next step
  auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - last_report_).count();
  const uint64_t bytes = done - reported_bytes_;
  reported_bytes_ = done;
  last_report_ = now;
  if (seconds <= 0) return;
  if (tuner_->report(bytes, seconds)) {
    const autotune::TunedParams& t = tuner_->params();
    if (tuner_->done()) {
      logger()->info("{}: autotune done: fusion threshold {:.1f} MiB, switch point {} bytes ({:.1f} MB/s)", label_,
                     t.fusion_threshold_mb, t.switch_point_bytes, tuner_->best().score / 1e6);
    } else {
      logger()->debug("{}: autotune: trying fusion threshold {:.1f} MiB, switch point {} bytes", label_,
                      t.fusion_threshold_mb, t.switch_point_bytes);
    }
  }
}

Status CrossJob::cycle() {
  // One byte per cache bit, then the leader's parameters for this cycle
  // (every agent plans fusion and picks algorithms with the same values).
  std::vector<uint8_t> bits = state_.cacheVector();
  const size_t nbits = bits.size();
  measureForAutotune();
  AgreedParams proposal = agreed_;
  if (tuner_) {
    proposal.fusion_threshold_bytes = tuner_->params().fusionThresholdBytes();
    proposal.small_message_bytes = tuner_->params().switch_point_bytes;
  }
  bits.resize(nbits + AgreedParams::kWireBytes);
  proposal.encode(backend_->rank() == 0, bits.data() + nbits);
  RETURN_IF_ERROR(syncCollective([&](Backend::Done d) {
    backend_->allreduce(bits.data(), bits.size(), DataType::kUint8, ReduceOp::kMin, std::move(d));
  }));
  applyAgreed(AgreedParams::decode(bits.data() + nbits));
  bits.resize(nbits);
  std::vector<std::string> gathered;
  bool gather = bits[0] == 0;
  if (gather) {
    std::string mine = state_.takeAnnouncements();
    const int n = backend_->size();
    std::vector<uint64_t> sizes(n, 0);
    uint64_t my_size = mine.size();
    RETURN_IF_ERROR(syncCollective([&](Backend::Done d) {
      backend_->allgatherv(&my_size, 8, sizes.data(), std::vector<size_t>(n, 8), std::move(d));
    }));
    std::vector<size_t> recv(n);
    size_t total = 0;
    for (int i = 0; i < n; ++i) total += recv[i] = sizes[i];
    std::string all(total, '\0');
    RETURN_IF_ERROR(syncCollective([&](Backend::Done d) {
      backend_->allgatherv(mine.data(), mine.size(), all.data(), recv, std::move(d));
    }));
    size_t off = 0;
    for (int i = 0; i < n; ++i) {
      gathered.push_back(all.substr(off, recv[i]));
      off += recv[i];
    }
  }
  std::vector<CrossResponse> responses = state_.complete(bits, gather ? &gathered : nullptr);
  if (options_.timeline != nullptr && options_.timeline->markCycles()) options_.timeline->markCycleStart();
  std::vector<CrossWork> data;
  for (CrossResponse& r : responses) {
    auto it = waiting_.find(r.name);
    if (it == waiting_.end()) {
      // Agreed by every agent, so it must be ours too: a bug if not.
      return internalError("negotiated '" + r.name + "' which this agent never submitted");
    }
    CrossWork w = std::move(it->second);
    waiting_.erase(it);
    if (options_.timeline != nullptr) options_.timeline->activityEnd(r.name);  // NEGOTIATE_ACROSS_AGENTS
    if (!r.error.isOk() || w.count == 0) {
      loop_.post([cb = on_done_, name = r.name, st = r.error] { cb(name, st); });
      continue;
    }
    data.push_back(std::move(w));
  }
  postData(std::move(data));
  return okStatus();
}

void CrossJob::postData(std::vector<CrossWork> works) {
  // Only allreduces fuse; any other collective closes the current batch, so
  // the backend sees the agreed order on every agent.
  std::vector<CrossWork> batch;
  for (CrossWork& w : works) {
    if (fusion::isFusable(w.collective) && w.collective == CollectiveType::kAllreduce) {
      batch.push_back(std::move(w));
      continue;
    }
    postAllreduces(std::move(batch));
    batch.clear();
    postOther(std::move(w));
  }
  postAllreduces(std::move(batch));
}

void CrossJob::postOther(CrossWork w) {
  std::string name = w.req.name;
  Timeline* tl = options_.timeline;
  auto done = [this, name, tl](Status st) {
    if (tl != nullptr) tl->activityEnd(name);
    loop_.post([cb = on_done_, name, st] { cb(name, st); });
  };
  switch (w.collective) {
    case CollectiveType::kBroadcast:
      if (tl != nullptr) tl->activityStart(name, "CROSS_BROADCAST", {{"backend", std::string(backend_->name())}});
      backend_->broadcast(w.staging, w.count * dataTypeSize(w.dtype), w.root, std::move(done));
      return;
    case CollectiveType::kAllgather: {
      const int me = backend_->rank();
      size_t off = 0;
      for (int i = 0; i < me; ++i) off += w.block_bytes[i];
      char* base = static_cast<char*>(w.staging);
      if (tl != nullptr) tl->activityStart(name, "CROSS_ALLGATHER", {{"backend", std::string(backend_->name())}});
      backend_->allgatherv(base + off, w.block_bytes[me], base, w.block_bytes, std::move(done));
      return;
    }
    case CollectiveType::kReducescatter: {
      const int me = backend_->rank();
      size_t off = 0;
      for (int i = 0; i < me; ++i) off += w.block_counts[i];
      char* base = static_cast<char*>(w.staging);
      if (tl != nullptr) tl->activityStart(name, "CROSS_REDUCESCATTER", {{"backend", std::string(backend_->name())}});
      backend_->reducescatter(base, base + off * dataTypeSize(w.dtype), w.block_counts, w.dtype, w.op,
                              std::move(done));
      return;
    }
    case CollectiveType::kAlltoall:
      if (tl != nullptr) tl->activityStart(name, "CROSS_ALLTOALL", {{"backend", std::string(backend_->name())}});
      backend_->alltoallv(w.send, w.send_bytes, w.staging, w.recv_bytes, std::move(done));
      return;
    default:
      loop_.post([cb = on_done_, name, c = w.collective] {
        cb(name, invalidArgument(std::string(collectiveName(c)) + " is not supported across agents"));
      });
      return;
  }
}

void CrossJob::postAllreduces(std::vector<CrossWork> works) {
  if (works.empty()) return;
  std::vector<fusion::FusionEntry> entries;
  entries.reserve(works.size());
  for (const CrossWork& w : works) {
    fusion::FusionEntry e;
    e.name = w.req.name;
    e.dtype = w.dtype;
    e.reduce_op = w.op;
    e.bytes = w.count * dataTypeSize(w.dtype);
    entries.push_back(std::move(e));
  }
  fusion::FusionOptions fo;
  fo.threshold_bytes = agreed_.fusion_threshold_bytes;
  Timeline* tl = options_.timeline;
  for (const fusion::FusedGroup& g : fusion::planFusion(entries, fo)) {
    if (!g.fused()) {
      CrossWork& w = works[g.slots[0].index];
      std::string name = w.req.name;
      if (tl != nullptr) tl->activityStart(name, "CROSS_ALLREDUCE", {{"backend", std::string(backend_->name())}});
      const uint64_t bytes = w.count * dataTypeSize(w.dtype);
      backend_->allreduce(w.staging, w.count, w.dtype, w.op, [this, name, tl, bytes](Status st) {
        if (st.isOk()) allreduced_bytes_.fetch_add(bytes, std::memory_order_relaxed);
        if (tl != nullptr) tl->activityEnd(name);
        loop_.post([cb = on_done_, name, st] { cb(name, st); });
      });
      continue;
    }
    // Pack the group into one buffer (aligned offsets, zeroed gaps) and
    // reduce it in chunks: chunk k is posted as soon as it is packed, so
    // packing k+1 overlaps its transfer, and each chunk is unpacked as soon
    // as it is reduced. The backend runs one job's collectives in order, so
    // every tensor is complete when the last chunk is.
    struct Part {
      std::string name;
      void* staging;
      uint64_t offset, bytes;
    };
    struct Fused {
      std::vector<Part> parts;
      std::shared_ptr<char> buf;
      std::mutex mu;
      Status first_error;
      size_t chunks_left = 0;
    };
    auto fused = std::make_shared<Fused>();
    size_t buf_bytes = fusion::alignUp(std::max<uint64_t>(g.buffer_bytes, 64), 64);
    fused->buf = std::shared_ptr<char>(static_cast<char*>(std::aligned_alloc(64, buf_bytes)), std::free);
    char* buf = fused->buf.get();
    if (options_.fusion_fill != nullptr && agreed_.fusion_threshold_bytes > 0) {
      options_.fusion_fill->set(static_cast<double>(g.buffer_bytes) / agreed_.fusion_threshold_bytes);
    }
    DataType dt = works[g.slots[0].index].dtype;
    ReduceOp op = works[g.slots[0].index].op;
    const size_t esize = dataTypeSize(dt);
    for (const fusion::FusedSlot& s : g.slots) {
      CrossWork& w = works[s.index];
      fused->parts.push_back({w.req.name, w.staging, s.offset, s.bytes});
      if (tl != nullptr) {
        tl->activityStart(w.req.name, "CROSS_ALLREDUCE",
                          {{"backend", std::string(backend_->name())}, {"fused", std::to_string(g.slots.size())}});
      }
    }
    // Chunk bounds: whole 64-byte lines (so whole elements), at most
    // agreed_.fusion_chunk_bytes each.
    uint64_t chunk = agreed_.fusion_chunk_bytes == 0 ? buf_bytes
                                                     : std::max<uint64_t>(64, agreed_.fusion_chunk_bytes / 64 * 64);
    std::vector<std::pair<uint64_t, uint64_t>> chunks;  // [begin, end)
    for (uint64_t b = 0; b < buf_bytes; b += chunk) chunks.emplace_back(b, std::min<uint64_t>(buf_bytes, b + chunk));
    fused->chunks_left = chunks.size();
    // Copies the parts' bytes that fall into [b, e) in (pack) or out (unpack).
    // Packing also zeroes the alignment gaps (parts are in offset order).
    auto copyRange = [](Fused& f, uint64_t b, uint64_t e, bool pack) {
      uint64_t cursor = b;
      for (const Part& p : f.parts) {
        uint64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.bytes);
        if (lo >= hi) continue;
        char* fb = f.buf.get() + lo;
        char* sb = static_cast<char*>(p.staging) + (lo - p.offset);
        if (pack) {
          if (lo > cursor) std::memset(f.buf.get() + cursor, 0, lo - cursor);
          std::memcpy(fb, sb, hi - lo);
          cursor = hi;
        } else {
          std::memcpy(sb, fb, hi - lo);
        }
      }
      if (pack && cursor < e) std::memset(f.buf.get() + cursor, 0, e - cursor);
    };
    for (auto [b, e] : chunks) {
      copyRange(*fused, b, e, true);
      const uint64_t bytes = e - b;
      backend_->allreduce(buf + b, bytes / esize, dt, op, [this, fused, tl, b, e, bytes, copyRange](Status st) {
        if (st.isOk()) {
          allreduced_bytes_.fetch_add(bytes, std::memory_order_relaxed);
          copyRange(*fused, b, e, false);
        }
        Status final_status;
        {
          std::lock_guard<std::mutex> lk(fused->mu);
          if (!st.isOk() && fused->first_error.isOk()) fused->first_error = st;
          if (--fused->chunks_left > 0) return;
          final_status = fused->first_error;
        }
        for (const Part& p : fused->parts) {
          if (tl != nullptr) tl->activityEnd(p.name);
          loop_.post([cb = on_done_, name = p.name, final_status] { cb(name, final_status); });
        }
      });
    }
  }
}

}  // namespace kolo
