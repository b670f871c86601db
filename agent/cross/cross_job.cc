#include "agent/cross/cross_job.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string_view>

#include "agent/cross/fusion_buffer.h"
#include "agent/fusion/chunk_planner.h"
#include "agent/fusion/fusion_planner.h"
#include "agent/timeline/timeline.h"
#include "common/log.h"
#include "common/reduce.h"
#include "common/staging_pool.h"

namespace kolo {

namespace {
auto logger() { return log::get("agent.cross"); }
}  // namespace

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
  agreed_.fusion_max_tensor_bytes = options_.fusion_max_tensor_bytes;
  agreed_.inline_bytes = options_.inline_bytes;
  agreed_.pipeline_bytes = options_.pipeline_bytes;
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
  drainer_ = std::make_unique<WorkerPool>("drain", 1);
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
  device_backend_.reset();  // (NCCL) completes anything still queued with Aborted
  backend_.reset();  // completes anything still queued with Aborted
  drainer_.reset();  // runs the drains (and completions) those queued
}

void CrossJob::submit(CrossWork work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.isOk() && !stop_) {
      incoming_.push_back(std::move(work));
      has_incoming_.store(true, std::memory_order_release);
      cv_.notify_all();
      return;
    }
  }
  // The negotiation thread has ended (or is ending): nothing would pick the
  // work up, so it fails now instead of waiting for its deadline.
  Status why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = aborted_.isOk() ? aborted("the job's generation ended") : aborted_;
  }
  postDone(work.req.name, why);
}

void CrossJob::submitJoin(CrossWork join) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    joined_ = true;
    join_name_ = join.req.name;
    incoming_.push_back(std::move(join));
    has_incoming_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void CrossJob::postDone(const std::string& name, const Status& st, CrossResult result) {
  loop_.post([cb = on_done_, name, st, result = std::move(result)] { cb(name, st, result); });
}

void CrossJob::abort(Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.isOk()) aborted_ = why;
  }
  quit_.store(true, std::memory_order_relaxed);
  backend_->abort(why);
  if (device_backend_) device_backend_->abort(why);
  cv_.notify_all();
}

void CrossJob::setDeviceCross(gpu::DeviceCrossChoice choice, std::unique_ptr<Backend> nccl) {
  device_cross_ = std::move(choice);
  device_backend_ = std::move(nccl);
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.isOk() && device_backend_) device_backend_->abort(aborted_);
}

Status CrossJob::syncCollective(const std::function<void(Backend::Done)>& post) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  post([p](Status st) { p->set_value(std::move(st)); });
  spinUntil([&] { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
  // The backend bounds every collective by its own timeout; this is a backstop.
  if (f.wait_for(options_.collective_timeout + std::chrono::seconds(5)) != std::future_status::ready) {
    return timedOut("negotiation collective did not finish within " +
                    std::to_string(options_.collective_timeout.count()) + " ms");
  }
  return f.get();
}

void CrossJob::spinUntil(const std::function<bool()>& ready) const {
  if (options_.spin.count() <= 0) return;
  const auto end = std::chrono::steady_clock::now() + options_.spin;
  while (!ready() && std::chrono::steady_clock::now() < end) ::sched_yield();
}

void CrossJob::run() {
  bool worked = false;
  for (;;) {
    // Right after a cycle the next name usually follows within microseconds.
    if (worked) spinUntil([&] { return has_incoming_.load(std::memory_order_acquire); });
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Enter the next cycle at once when there is work (new or still
      // negotiating); otherwise tick every options_.idle_cycle so that peers waiting
      // on us never wait longer than that.
      cv_.wait_for(lock, options_.idle_cycle, [&] {
        return stop_ || !aborted_.isOk() || !incoming_.empty() || !waiting_.empty();
      });
      if (stop_ || !aborted_.isOk()) break;
      worked = !incoming_.empty() || !waiting_.empty();
      has_incoming_.store(false, std::memory_order_relaxed);
      while (!incoming_.empty()) {
        CrossWork w = std::move(incoming_.front());
        incoming_.pop_front();
        auto failed = failed_groups_.find(w.req.params.group_id);
        if (w.req.params.group_id != 0 && failed != failed_groups_.end()) {
          postDone(w.req.name, failed->second);
          continue;
        }
        state_.addLocal(w.req);
        std::string name = w.req.name;
        waiting_[name] = std::move(w);
      }
      state_.setJoined(joined_);
    }
    state_.standInForJoined();
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
    postDone(name, why);
  }
  waiting_.clear();
  for (auto& [gid, g] : held_groups_) {
    for (auto& [w, mine] : g.works) {
      if (mine) postDone(w.req.name, why);
    }
  }
  held_groups_.clear();
}

void CrossJob::applyAgreed(const AgreedParams& p) {
  if (p.small_message_bytes != agreed_.small_message_bytes) backend_->setSmallMessageBytes(p.small_message_bytes);
  agreed_ = p;
  agreed_in_cycle_ = true;
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
  const bool changed = tuner_->report(bytes, seconds);
  const autotune::TunedParams& t = tuner_->params();
  if (tuner_->done()) {
    // Logged once: measureForAutotune returns early from now on. (The final
    // choice may equal the last sample, so `changed` can be false here.)
    logger()->info("{}: autotune done: fusion threshold {:.1f} MiB, switch point {} bytes ({:.1f} MB/s)", label_,
                   t.fusion_threshold_mb, t.switch_point_bytes, tuner_->best().score / 1e6);
  } else if (changed) {
    logger()->debug("{}: autotune: trying fusion threshold {:.1f} MiB, switch point {} bytes", label_,
                    t.fusion_threshold_mb, t.switch_point_bytes);
  }
}

Status CrossJob::cycle() {
  // The cache vector, then the leader's parameters for this cycle (every
  // agent plans fusion and picks algorithms with the same values).
  measureForAutotune();
  AgreedParams proposal = agreed_;
  if (tuner_) {
    proposal.fusion_threshold_bytes = tuner_->params().fusionThresholdBytes();
    proposal.small_message_bytes = tuner_->params().switch_point_bytes;
  }
  // Small cached allreduces ride along (docs/fusion-and-timeline.md,
  // "Inline allreduces"): the message grows by a payload region laid out
  // from the cache (so alike on every agent) holding this agent's data for
  // those that are ready here, and is allgathered instead of Min-reduced
  // (CycleMessage); one round trip both agrees and reduces them, with the
  // same bits on every agent. (The parameters that size the region are the
  // previous cycle's agreed ones.)
  std::vector<NegotiationState::InlineSlot> slots;
  if (agreed_in_cycle_ && agreed_.inline_bytes > 0) {
    slots = state_.inlineSlots(agreed_.inline_bytes, std::max(kInlineRegionBytes, agreed_.inline_bytes));
  }
  const bool inline_usable = !state_.invertedBits();
  CycleMessage msg(state_.cacheVector(), proposal, backend_->rank() == 0, std::move(slots));
  RETURN_IF_ERROR(exchangeCycleMessage(msg));
  applyAgreed(msg.agreed());
  // A slot's allreduce completes in this cycle if every agent set its bit
  // (or stands in for joined ranks with zeros: its region stays zero).
  std::unordered_map<std::string_view, const NegotiationState::InlineSlot*> inline_now;
  if (inline_usable) {
    for (const auto* slot : msg.agreedInline()) inline_now.emplace(slot->name, slot);
  }
  const std::vector<uint8_t> bits = msg.reducedCacheVector();
  std::vector<std::string> gathered;
  const bool gather = bits[0] == 0;
  if (gather) RETURN_IF_ERROR(gatherAnnouncements(gathered));
  std::vector<CrossResponse> responses = state_.complete(bits, gather ? &gathered : nullptr);
  if (options_.timeline != nullptr && options_.timeline->markCycles()) options_.timeline->markCycleStart();
  std::vector<CrossWork> data;
  for (CrossResponse& r : responses) {
    if (!inline_now.empty() && r.error.isOk()) {
      auto sit = inline_now.find(r.name);
      if (sit != inline_now.end()) {
        completeInline(r.name, *sit->second, msg);
        continue;
      }
    }
    RETURN_IF_ERROR(takeAgreed(r, data));
  }
  postData(std::move(data));
  return okStatus();
}

Status CrossJob::exchangeCycleMessage(CycleMessage& msg) {
  const int nagents = backend_->size();
  if (!msg.gathers()) {
    return syncCollective([&](Backend::Done d) {
      backend_->allreduce(msg.data(), msg.size(), DataType::kUint8, ReduceOp::kMin, std::move(d));
    });
  }
  for (const auto& slot : msg.slots()) {
    auto it = waiting_.find(slot.name);
    if (it == waiting_.end() || it->second.staging == nullptr) continue;
    fillWhole(it->second);
    const size_t bytes = it->second.count * dataTypeSize(it->second.dtype);
    if (bytes <= slot.bytes) std::memcpy(msg.payload(slot), it->second.staging, bytes);
  }
  uint8_t* all = msg.gatherBuffer(nagents);
  RETURN_IF_ERROR(syncCollective([&](Backend::Done d) {
    backend_->allgatherv(msg.data(), msg.size(), all, std::vector<size_t>(nagents, msg.size()),
                         std::move(d));
  }));
  msg.combineGathered();
  return okStatus();
}

Status CrossJob::gatherAnnouncements(std::vector<std::string>& gathered) {
  std::string mine = state_.takeAnnouncements();
  const int n = backend_->size();
  std::vector<uint64_t> sizes(n, 0);
  uint64_t my_size = mine.size();
  RETURN_IF_ERROR(syncCollective([&](Backend::Done d) {
    backend_->allgatherv(&my_size, 8, sizes.data(), std::vector<size_t>(n, 8), std::move(d));
  }));
  std::vector<size_t> recv(n);
  size_t total = 0;
  for (int i = 0; i < n; ++i) {
    // A peer's announced size sizes our buffer: bounded (every agent sees
    // the same sizes, so every agent fails this cycle alike).
    if (sizes[i] > kMaxAnnouncementBytes) {
      return invalidArgument("agent " + std::to_string(i) + " of the job announced " +
                             std::to_string(sizes[i]) +
                             " bytes of requests in one negotiation cycle (limit " +
                             std::to_string(kMaxAnnouncementBytes) + ")");
    }
    total += recv[i] = sizes[i];
  }
  std::string all(total, '\0');
  RETURN_IF_ERROR(syncCollective([&](Backend::Done d) {
    backend_->allgatherv(mine.data(), mine.size(), all.data(), recv, std::move(d));
  }));
  size_t off = 0;
  for (int i = 0; i < n; ++i) {
    gathered.push_back(all.substr(off, recv[i]));
    off += recv[i];
  }
  return okStatus();
}

Status CrossJob::takeAgreed(CrossResponse& r, std::vector<CrossWork>& data) {
  auto it = waiting_.find(r.name);
  CrossWork w;
  const bool mine = it != waiting_.end();
  if (!mine && r.params.group_id != 0 && failed_groups_.count(r.params.group_id) != 0) {
    // A member of a group that failed earlier in this list of responses:
    // it was failed (and dropped from waiting_) with the group.
    return okStatus();
  }
  if (!mine) {
    bool joined;
    {
      std::lock_guard<std::mutex> lock(mu_);
      joined = joined_;
    }
    // Agreed by every agent, so it must be ours too (or we stand in for
    // joined ranks): a bug if not.
    if (!joined)
      return internalError("negotiated '" + r.name + "' which this agent never submitted");
    ASSIGN_OR_RETURN(w, zeroContribution(r));
  } else {
    w = std::move(it->second);
    waiting_.erase(it);
    if (options_.timeline != nullptr)
      options_.timeline->activityEnd(r.name);  // NEGOTIATE_ACROSS_AGENTS
    std::lock_guard<std::mutex> lock(mu_);
    if (joined_ && r.name == join_name_) {
      joined_ = false;  // every rank has joined: stop standing in
      stand_in_sizes_.clear();
    }
  }
  if (r.params.group_id != 0 && r.params.group_size > 1) {
    holdGroupMember(r, std::move(w), mine, data);
    return okStatus();
  }
  if (!r.error.isOk() || w.count == 0) {
    if (mine) postDone(r.name, r.error);
    return okStatus();
  }
  data.push_back(std::move(w));
  return okStatus();
}

void CrossJob::holdGroupMember(const CrossResponse& r, CrossWork w, bool mine,
                               std::vector<CrossWork>& data) {
  // Grouped allreduce: hold the members until the whole group is agreed
  // (every agent sees the same responses, so every agent holds alike).
  const uint64_t gid = r.params.group_id;
  Status err = r.error;
  auto failed = failed_groups_.find(gid);
  if (err.isOk() && failed != failed_groups_.end()) err = failed->second;
  if (!err.isOk()) {
    if (failed == failed_groups_.end()) failGroup(r, err);
    if (mine) postDone(r.name, err);
    return;
  }
  HeldGroup& g = held_groups_[gid];
  g.works.emplace_back(std::move(w), mine);
  if (g.works.size() < r.params.group_size) return;
  for (auto& [member, member_mine] : g.works) {
    if (member.count == 0) {
      if (member_mine) postDone(member.req.name, okStatus());
      continue;
    }
    data.push_back(std::move(member));  // next to each other: they fuse
  }
  held_groups_.erase(gid);
}

void CrossJob::failGroup(const CrossResponse& r, const Status& err) {
  const uint64_t gid = r.params.group_id;
  Status why = invalidArgument(
      "grouped " + std::string(collectiveName(static_cast<CollectiveType>(r.params.collective))) +
      " #" + std::to_string(gid) +
      " failed because another of its tensors failed: " + err.message());
  failed_groups_[gid] = why;
  while (failed_groups_.size() > 256) failed_groups_.erase(failed_groups_.begin());
  auto h = held_groups_.find(gid);
  if (h != held_groups_.end()) {
    for (auto& [held, held_mine] : h->second.works) {
      if (held_mine) postDone(held.req.name, why);
    }
    held_groups_.erase(h);
  }
  // Members still negotiating (some agents may never submit them).
  state_.forgetGroup(gid);
  for (auto wit = waiting_.begin(); wit != waiting_.end();) {
    if (wit->second.req.params.group_id == gid) {
      postDone(wit->first, why);
      wit = waiting_.erase(wit);
    } else {
      ++wit;
    }
  }
}

void CrossJob::completeInline(const std::string& name, const CycleMessage::InlineSlot& slot,
                              const CycleMessage& msg) {
  auto it = waiting_.find(name);
  if (it == waiting_.end()) return;  // standing in for joined ranks: their zeros are in the region already
  CrossWork w = std::move(it->second);
  waiting_.erase(it);
  Timeline* tl = options_.timeline;
  if (tl != nullptr) {
    tl->activityEnd(name);  // NEGOTIATE_ACROSS_AGENTS
    tl->activityStart(name, "CROSS_ALLREDUCE", {{"backend", std::string(backend_->name())}, {"inline", "1"}});
  }
  const size_t bytes = w.count * dataTypeSize(w.dtype);
  if (bytes > slot.bytes) {  // cannot happen: a slot holds the request's data_bytes
    Status st = internalError("inline allreduce of tensor '" + name + "': " + std::to_string(bytes) +
                              " bytes do not fit its " + std::to_string(slot.bytes) + "-byte slot");
    if (tl != nullptr) tl->activityEnd(name);
    postDone(name, st);
    return;
  }
  if (bytes > 0) {
    // Agent order on every agent: the same bits everywhere.
    const int nagents = msg.agents();
    std::vector<const void*> srcs(nagents);
    for (int a = 0; a < nagents; ++a) srcs[a] = msg.gatheredPayload(a, slot);
    void* dst = w.staging;
    reduceBlocks(w.dtype, w.op, srcs.data(), nagents, &dst, 1, w.count, 1.0, 1.0);
    allreduced_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (tl != nullptr) tl->activityEnd(name);
  postDone(name, okStatus());
}

StatusOr<CrossWork> CrossJob::zeroContribution(const CrossResponse& r) {
  CrossWork z;
  z.req.name = r.name;
  z.req.params = r.params;
  z.collective = static_cast<CollectiveType>(r.params.collective);
  auto alloc = [&z](size_t bytes) {
    size_t n = (std::max<size_t>(bytes, 64) + 63) / 64 * 64;
    auto buf = staging::acquireShared(n);
    std::memset(buf.get(), 0, n);
    z.staging = buf.get();
    z.keep = buf;
  };
  if (z.collective == CollectiveType::kAllgather) {
    // Zero rows from every joined rank here: the ranks' first dimensions
    // come from the "<name>.__sizes" allreduce this agent stood in for (the
    // backend completes collectives in order, so its result is final).
    auto it = stand_in_sizes_.find(r.name + std::string(kAllgatherSizesSuffix));
    const size_t world = options_.rank_offsets.empty()
                             ? 0
                             : static_cast<size_t>(options_.rank_offsets.back() + options_.local_sizes.back());
    if (it == stand_in_sizes_.end() || world == 0) {
      return internalError("allgather of tensor '" + r.name +
                           "': this agent stands in for joined ranks but never saw the ranks' first dimensions");
    }
    const auto* dims = static_cast<const int64_t*>(it->second.get());
    uint64_t row = dataTypeSize(static_cast<DataType>(r.params.dtype));
    for (int i = 1; i < r.params.ndim && i < kMaxDims; ++i) row *= static_cast<uint64_t>(r.params.shape[i]);
    uint64_t total = 0;
    auto& blocks = z.blocks.emplace<AllgatherBlocks>();
    for (size_t a = 0; a < options_.rank_offsets.size(); ++a) {
      uint64_t block = 0;
      for (int g = options_.rank_offsets[a]; g < options_.rank_offsets[a] + options_.local_sizes[a]; ++g) {
        block += static_cast<uint64_t>(dims[g]) * row;
      }
      blocks.bytes.push_back(block);
      total += block;
    }
    stand_in_sizes_.erase(it);
    z.dtype = DataType::kUint8;
    z.count = total;
    if (total > 0) alloc(total);
    return z;
  }
  z.collective = CollectiveType::kAllreduce;  // anything else was refused while joined
  z.dtype = static_cast<DataType>(r.params.dtype);
  auto op = static_cast<ReduceOp>(r.params.reduce_op);
  z.op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;  // as the agents that reduce real data do
  z.count = r.params.data_bytes / dataTypeSize(z.dtype);
  if (z.count == 0) return z;
  alloc(r.params.data_bytes);
  if (z.dtype == DataType::kInt64 && isAllgatherSizesName(r.name)) {
    stand_in_sizes_[r.name] = z.keep;  // an allgather's first dimensions: kept for the gather
  }
  return z;
}

void CrossJob::postData(std::vector<CrossWork> works) {
  // Consecutive allreduces fuse (postAllreduces), and so do consecutive
  // allgathers and consecutive reducescatters of one dtype and op
  // (postBlocks, cross_fuse_blocks.cc); anything else closes the current
  // batch, so the backend sees the agreed order on every agent.
  std::vector<CrossWork> batch;
  auto flush = [&] {
    if (batch.empty()) return;
    if (batch[0].collective == CollectiveType::kAllreduce) {
      postAllreduces(std::move(batch));
    } else {
      postBlocks(std::move(batch));
    }
    batch.clear();
  };
  for (CrossWork& w : works) {
    if (w.device_post) {
      flush();
      postDevice(std::move(w));
      continue;
    }
    const bool blocks = w.collective == CollectiveType::kAllgather || w.collective == CollectiveType::kReducescatter;
    if (w.collective == CollectiveType::kAllreduce || blocks) {
      if (!batch.empty() && batch[0].collective != w.collective) flush();
      if (!batch.empty() && blocks && !fusesWith(batch[0], w)) flush();
      batch.push_back(std::move(w));
      continue;
    }
    flush();
    postOther(std::move(w));
  }
  flush();
}

void CrossJob::postDevice(CrossWork w) {
  std::string name = w.req.name;
  Timeline* tl = options_.timeline;
  if (!device_backend_) {
    postDone(name,
             internalError("device tensor '" + name +
                           "': routed over NCCL but the generation has no NCCL communicator"));
    return;
  }
  if (!device_logged_) {  // once per generation: the route is in use
    device_logged_ = true;
    logger()->info("{}: device tensors cross agents over NCCL (the first: '{}')", label_, name);
  }
  if (tl != nullptr) tl->activityStart(name, "CROSS_NCCL", {{"backend", "nccl"}});
  w.device_post(*device_backend_, [this, name, tl](Status st) {
    if (tl != nullptr) tl->activityEnd(name);
    postDone(name, st);
  });
}

void CrossJob::postOther(CrossWork w) {
  std::string name = w.req.name;
  Timeline* tl = options_.timeline;
  auto done = [this, name, tl, keep = w.keep](Status st) {  // keep: a stand-in's buffer lives until done
    if (tl != nullptr) tl->activityEnd(name);
    postDone(name, st);
  };
  switch (w.collective) {
    case CollectiveType::kBroadcast:
      if (tl != nullptr) tl->activityStart(name, "CROSS_BROADCAST", {{"backend", std::string(backend_->name())}});
      backend_->broadcast(w.staging, w.count * dataTypeSize(w.dtype), w.root, std::move(done));
      return;
    case CollectiveType::kAllgather:
      if (const auto* b = std::get_if<AllgatherBlocks>(&w.blocks)) {
        const int me = backend_->rank();
        size_t off = 0;
        for (int i = 0; i < me; ++i) off += b->bytes[i];
        char* base = static_cast<char*>(w.staging);
        if (tl != nullptr)
          tl->activityStart(name, "CROSS_ALLGATHER", {{"backend", std::string(backend_->name())}});
        backend_->allgatherv(base + off, b->bytes[me], base, b->bytes, std::move(done));
        return;
      }
      break;
    case CollectiveType::kReducescatter:
      if (const auto* b = std::get_if<ReducescatterBlocks>(&w.blocks)) {
        const int me = backend_->rank();
        size_t off = 0;
        for (int i = 0; i < me; ++i) off += b->counts[i];
        char* base = static_cast<char*>(w.staging);
        if (tl != nullptr)
          tl->activityStart(name, "CROSS_REDUCESCATTER",
                            {{"backend", std::string(backend_->name())}});
        backend_->reducescatter(base, base + off * dataTypeSize(w.dtype), b->counts, w.dtype, w.op,
                                std::move(done));
        return;
      }
      break;
    case CollectiveType::kAlltoall:
      if (const auto* b = std::get_if<AlltoallBlocks>(&w.blocks)) {
        if (tl != nullptr)
          tl->activityStart(name, "CROSS_ALLTOALL", {{"backend", std::string(backend_->name())}});
        backend_->alltoallv(b->send, b->send_bytes, w.staging, b->recv_bytes, std::move(done));
        return;
      }
      break;
    default:
      postDone(name, invalidArgument(std::string(collectiveName(w.collective)) + " is not supported across agents"));
      return;
  }
  postDone(name, internalError(std::string(collectiveName(w.collective)) + " of tensor '" + name +
                               "' reached the backend without its blocks"));
}

void CrossJob::awaitInput(const CrossWork& w, size_t end) const {
  if (w.await_input) w.await_input(end, quit_, options_.collective_timeout);
}

void CrossJob::fillWhole(CrossWork& w) {
  awaitInput(w, w.count);
  if (w.fill) {
    w.fill(0, w.count);
    w.fill = nullptr;
  }
}

void CrossJob::postPipelined(CrossWork w) {
  const std::string name = w.req.name;
  Timeline* tl = options_.timeline;
  if (tl != nullptr) {
    tl->activityStart(name, "CROSS_ALLREDUCE", {{"backend", std::string(backend_->name())}, {"pipelined", "1"}});
  }
  // Chunks of whole 64-byte lines (fusion::planChunks): the agreed fusion
  // chunk, but at least 4 chunks when that leaves each 1 MiB or more (so a
  // 16 MiB tensor overlaps too), and the whole tensor when chunking is off.
  const size_t es = dataTypeSize(w.dtype);
  const uint64_t bytes = w.count * es;
  uint64_t limit = agreed_.fusion_chunk_bytes == 0 ? bytes : agreed_.fusion_chunk_bytes;
  limit = std::max<uint64_t>(64, std::min(limit, std::max<uint64_t>(1 << 20, bytes / 4)));
  auto chunks = fusion::planChunks(bytes, limit, es);
  if (!chunks.isOk()) {  // cannot happen: whole elements, and every element size divides 64
    if (tl != nullptr) tl->activityEnd(name);
    postDone(name, chunks.status());
    return;
  }
  struct State {
    std::mutex mu;
    Status first_error;
    size_t remaining = 0;
    std::vector<std::pair<size_t, bool>>
        ends;              // each chunk's end (elements), and whether it is final
    size_t published = 0;  // chunks [0, published) were published
  };
  auto state = std::make_shared<State>();
  std::vector<std::pair<size_t, size_t>> ranges;  // in elements
  for (const fusion::Chunk& c : *chunks) {
    ranges.emplace_back(c.offset / es, (c.offset + c.bytes) / es);
    state->ends.emplace_back(ranges.back().second, false);
  }
  state->remaining = ranges.size();
  auto drain = std::make_shared<std::function<void(size_t, size_t)>>(std::move(w.drain));
  auto published = std::make_shared<std::function<void(size_t)>>(std::move(w.published));
  char* base = static_cast<char*>(w.staging);
  const char* input = static_cast<const char*>(w.input);
  for (size_t index = 0; index < ranges.size(); ++index) {
    const auto [b, e] = ranges[index];
    awaitInput(w, e);  // streamed copy-in: the trainers' copies run ahead of the ring
    if (w.fill && input == nullptr) w.fill(b, e);  // the local reduction of this chunk, while the previous one moves
    backend_->allreduceOutOfPlace(
        input != nullptr ? input + b * es : base + b * es, base + b * es, e - b, w.dtype, w.op,
        [this, name, tl, state, drain, published, index, b, e, es, keep = w.keep](Status st) {
          if (st.isOk()) allreduced_bytes_.fetch_add((e - b) * es, std::memory_order_relaxed);
          drainer_->submit([this, name, tl, state, drain, published, index, b, e, st, keep] {
            if (st.isOk() && *drain) (*drain)(b, e);
            Status final_status;
            {
              std::lock_guard<std::mutex> lk(state->mu);
              if (!st.isOk() && state->first_error.isOk()) state->first_error = st;
              state->ends[index].second = true;
              if (*published && state->first_error.isOk()) {
                // Streamed copy-out: the longest run of final chunks from the start.
                size_t n = state->published;
                while (n < state->ends.size() && state->ends[n].second) ++n;
                if (n > state->published) {
                  state->published = n;
                  (*published)(state->ends[n - 1].first);
                }
              }
              if (--state->remaining > 0) return;
              final_status = state->first_error;
            }
            if (tl != nullptr) tl->activityEnd(name);
            CrossResult r;
            r.drained = final_status.isOk() && *drain;
            postDone(name, final_status, std::move(r));
          });
        });
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
  fo.max_entry_bytes = agreed_.fusion_max_tensor_bytes;
  Timeline* tl = options_.timeline;
  for (const fusion::FusedGroup& g : fusion::planFusion(entries, fo)) {
    if (!g.fused()) {
      CrossWork& w = works[g.slots[0].index];
      const uint64_t w_bytes = w.count * dataTypeSize(w.dtype);
      if (agreed_.pipeline_bytes > 0 && w_bytes >= agreed_.pipeline_bytes) {
        postPipelined(std::move(w));
        continue;
      }
      fillWhole(w);
      std::string name = w.req.name;
      if (tl != nullptr) tl->activityStart(name, "CROSS_ALLREDUCE", {{"backend", std::string(backend_->name())}});
      const uint64_t bytes = w.count * dataTypeSize(w.dtype);
      backend_->allreduce(w.staging, w.count, w.dtype, w.op, [this, name, tl, bytes, keep = w.keep](Status st) {
        if (st.isOk()) allreduced_bytes_.fetch_add(bytes, std::memory_order_relaxed);
        if (tl != nullptr) tl->activityEnd(name);
        postDone(name, st);
      });
      continue;
    }
    // Pack the group into one buffer (aligned offsets, zeroed gaps) and
    // reduce it in chunks: chunk k is posted as soon as it is packed, so
    // packing k+1 overlaps its transfer. Nothing is unpacked: each tensor is
    // released, as soon as the chunk it ends in is reduced, with a view of
    // its bytes in the fused buffer (kept alive by the view), from which the
    // agent copies its result straight into the ranks' slots. The backend
    // runs one job's collectives in order, so every tensor is complete when
    // the last chunk is.
    using Part = FusionBuffer::Part;
    struct Fused {
      Fused(uint64_t bytes, uint64_t alloc_bytes) : buffer(bytes, alloc_bytes) {}
      FusionBuffer buffer;
      std::mutex mu;
      Status first_error;
      size_t next_part = 0;  // parts before it have been completed
    };
    const uint64_t buf_bytes = fusion::alignUp(std::max<uint64_t>(g.buffer_bytes, 64), 64);
    // One size for every fused buffer (the threshold), like Horovod's
    // persistent fusion buffer: the pool hands the same blocks back every
    // cycle, already faulted in, whatever each group's size.
    auto fused = std::make_shared<Fused>(buf_bytes, agreed_.fusion_threshold_bytes);
    char* buf = fused->buffer.data();
    if (options_.fusion_fill != nullptr && agreed_.fusion_threshold_bytes > 0) {
      options_.fusion_fill->set(static_cast<double>(g.buffer_bytes) / agreed_.fusion_threshold_bytes);
    }
    DataType dt = works[g.slots[0].index].dtype;
    ReduceOp op = works[g.slots[0].index].op;
    const size_t esize = dataTypeSize(dt);
    for (const fusion::FusedSlot& s : g.slots) {
      CrossWork& w = works[s.index];
      fillWhole(w);
      fused->buffer.add({w.req.name, w.staging, s.offset, s.bytes, -1, w.keep});
      if (tl != nullptr) {
        tl->activityStart(w.req.name, "CROSS_ALLREDUCE",
                          {{"backend", std::string(backend_->name())}, {"fused", std::to_string(g.slots.size())}});
      }
    }
    // Chunk bounds: whole 64-byte lines (so whole elements), at most
    // agreed_.fusion_chunk_bytes (but 64 or more) each (fusion::planChunks).
    const uint64_t limit =
        agreed_.fusion_chunk_bytes == 0 ? 0 : std::max<uint64_t>(64, agreed_.fusion_chunk_bytes);
    auto planned = fusion::planChunks(buf_bytes, limit, esize);
    std::vector<std::pair<uint64_t, uint64_t>> chunks;  // [begin, end)
    if (planned.isOk()) {  // cannot fail: the buffer is whole 64-byte lines
      for (const fusion::Chunk& c : *planned) chunks.emplace_back(c.offset, c.offset + c.bytes);
    } else {
      chunks.emplace_back(0, buf_bytes);
    }
    for (auto [b, e] : chunks) {
      fused->buffer.packRange(b, e);  // the parts' bytes in [b, e), alignment gaps zeroed
      const uint64_t bytes = e - b;
      backend_->allreduce(buf + b, bytes / esize, dt, op, [this, fused, tl, b, e, bytes](Status st) {
        if (st.isOk()) allreduced_bytes_.fetch_add(bytes, std::memory_order_relaxed);
        // Chunks complete in order, so every part that ends in this chunk
        // or before it is complete now: release it at once (its ranks get
        // their result while later chunks are still moving). After a failed
        // chunk, every part not yet released gets that error.
        std::vector<std::pair<const Part*, Status>> ready;
        {
          std::lock_guard<std::mutex> lk(fused->mu);
          if (!st.isOk() && fused->first_error.isOk()) fused->first_error = st;
          const bool last = e >= fused->buffer.size();
          const std::vector<Part>& parts = fused->buffer.parts();
          while (fused->next_part < parts.size()) {
            const Part& p = parts[fused->next_part];
            if (!last && p.offset + p.bytes > e) break;
            ready.emplace_back(&p, fused->first_error);
            ++fused->next_part;
          }
        }
        for (auto& [part, status] : ready) {
          if (tl != nullptr) tl->activityEnd(part->name);
          CrossResult view;
          if (status.isOk()) view = {fused->buffer.data() + part->offset, fused};
          postDone(part->name, status, std::move(view));
        }
      });
    }
  }
}

}  // namespace kolo
