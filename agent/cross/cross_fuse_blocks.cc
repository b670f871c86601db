// Tensor Fusion for allgather and reducescatter across agents: consecutive
// agreed allgathers (or reducescatters of one dtype and op) travel as one
// backend collective while they fit the fusion threshold.
//
// Both collectives cut their data into one block per agent. The fused
// buffer is agent-major: agent a's segment holds a's block of every tensor
// of the batch, in batch order; one allgatherv (or reducescatter) moves the
// segments, and the blocks are copied back into each tensor's own buffer
// (allgather: every agent's block; reducescatter: this agent's reduced
// block). Every agent groups alike: the batch and the block sizes are
// agreed, identical on every agent.
#include <cstring>

#include "agent/cross/cross_job.h"
#include "agent/cross/fusion_buffer.h"
#include "agent/timeline/timeline.h"

namespace kolo {

namespace {

// Bytes of agent a's block of work w.
size_t blockBytes(const CrossWork& w, size_t a) {
  if (const auto* g = std::get_if<AllgatherBlocks>(&w.blocks)) return g->bytes[a];
  const auto* r = std::get_if<ReducescatterBlocks>(&w.blocks);
  return r != nullptr ? r->counts[a] * dataTypeSize(w.dtype) : 0;
}

// Offset of agent a's block inside w's own buffer.
size_t blockOffset(const CrossWork& w, size_t a) {
  size_t off = 0;
  for (size_t i = 0; i < a; ++i) off += blockBytes(w, i);
  return off;
}

size_t totalBytes(const CrossWork& w, size_t agents) {
  size_t t = 0;
  for (size_t a = 0; a < agents; ++a) t += blockBytes(w, a);
  return t;
}

}  // namespace

bool CrossJob::fusesWith(const CrossWork& a, const CrossWork& b) {
  if (a.collective != b.collective) return false;
  if (a.collective == CollectiveType::kAllgather) return true;
  return a.collective == CollectiveType::kReducescatter && a.dtype == b.dtype && a.op == b.op;
}

void CrossJob::postBlocks(std::vector<CrossWork> works) {
  const size_t agents = static_cast<size_t>(backend_->size());
  const uint64_t threshold = agreed_.fusion_threshold_bytes;
  size_t i = 0;
  while (i < works.size()) {
    // The batch [i, j): consecutive works while their total fits the threshold.
    size_t j = i + 1;
    uint64_t total = totalBytes(works[i], agents);
    while (j < works.size() && threshold > 0) {
      uint64_t next = totalBytes(works[j], agents);
      if (total + next > threshold) break;
      total += next;
      ++j;
    }
    if (j - i == 1) {
      postOther(std::move(works[i]));
      i = j;
      continue;
    }
    // The fused buffer: one part per tensor and agent, agent-major.
    struct Batch {
      std::vector<CrossWork> works;
      std::unique_ptr<FusionBuffer> buffer;
      std::vector<size_t> seg_bytes;  // by agent
      std::vector<size_t> seg_off;    // by agent
    };
    auto b = std::make_shared<Batch>();
    for (size_t k = i; k < j; ++k) b->works.push_back(std::move(works[k]));
    i = j;
    b->seg_bytes.assign(agents, 0);
    b->seg_off.assign(agents, 0);
    for (size_t a = 0; a < agents; ++a) {
      for (const CrossWork& w : b->works) b->seg_bytes[a] += blockBytes(w, a);
      if (a > 0) b->seg_off[a] = b->seg_off[a - 1] + b->seg_bytes[a - 1];
    }
    const size_t bytes = b->seg_off[agents - 1] + b->seg_bytes[agents - 1];
    b->buffer = std::make_unique<FusionBuffer>(bytes, 64);
    for (size_t a = 0; a < agents; ++a) {
      size_t off = b->seg_off[a];
      for (CrossWork& w : b->works) {
        const size_t n = blockBytes(w, a);
        char* data = n > 0 ? static_cast<char*>(w.staging) + blockOffset(w, a) : nullptr;
        b->buffer->add({w.req.name, data, off, n, static_cast<int>(a), nullptr});
        off += n;
      }
    }
    char* buf = b->buffer->data();
    const size_t me = static_cast<size_t>(backend_->rank());
    const bool gather = b->works[0].collective == CollectiveType::kAllgather;
    // Pack: allgather, this agent's block of each tensor; reducescatter,
    // every agent's block of each tensor (all of them get reduced).
    b->buffer->packParts([gather, me](const FusionBuffer::Part& p) {
      return !gather || p.agent == static_cast<int>(me);
    });
    Timeline* tl = options_.timeline;
    const char* activity = gather ? "CROSS_ALLGATHER" : "CROSS_REDUCESCATTER";
    for (const CrossWork& w : b->works) {
      if (tl != nullptr) {
        tl->activityStart(w.req.name, activity,
                          {{"backend", std::string(backend_->name())}, {"fused", std::to_string(b->works.size())}});
      }
    }
    auto done = [this, b, tl, me, gather](Status st) {
      if (st.isOk()) {
        // Unpack: allgather, every agent's blocks; reducescatter, this
        // agent's reduced blocks.
        b->buffer->unpackParts([gather, me](const FusionBuffer::Part& p) {
          return gather || p.agent == static_cast<int>(me);
        });
      }
      for (const CrossWork& w : b->works) {
        if (tl != nullptr) tl->activityEnd(w.req.name);
        postDone(w.req.name, st);
      }
    };
    if (gather) {
      backend_->allgatherv(buf + b->seg_off[me], b->seg_bytes[me], buf, b->seg_bytes, std::move(done));
    } else {
      const size_t esize = dataTypeSize(b->works[0].dtype);
      std::vector<size_t> counts(agents);
      for (size_t a = 0; a < agents; ++a) counts[a] = b->seg_bytes[a] / esize;
      backend_->reducescatter(buf, buf + b->seg_off[me], std::move(counts), b->works[0].dtype, b->works[0].op,
                              std::move(done));
    }
  }
}

}  // namespace kolo
