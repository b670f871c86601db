#include "agent/cross/cycle_message.h"

#include <algorithm>
#include <cstring>

namespace kolo {

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
  put(out + 12, (fusion_max_tensor_bytes + 1023) >> 10);
  put(out + 16, inline_bytes);
  put(out + 20, (pipeline_bytes + 1023) >> 10);
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
  a.fusion_max_tensor_bytes = get(in + 12) << 10;
  a.inline_bytes = get(in + 16);
  a.pipeline_bytes = get(in + 20) << 10;
  return a;
}

CycleMessage::CycleMessage(std::vector<uint8_t> cache_vector, const AgreedParams& proposal,
                           bool leader, std::vector<InlineSlot> slots)
    : msg_(std::move(cache_vector)), cache_bytes_(msg_.size()), slots_(std::move(slots)) {
  msg_.resize(cache_bytes_ + AgreedParams::kWireBytes);
  proposal.encode(leader, msg_.data() + cache_bytes_);
  // The payload region starts 8-byte aligned in the message (messages are
  // whole multiples of 8 and the buffers are allocated aligned), so every
  // slot is aligned for its dtype wherever it is read.
  head_ = (msg_.size() + 7) / 8 * 8;
  if (!slots_.empty()) {
    msg_.resize((head_ + slots_.back().offset + slots_.back().bytes + 7) / 8 * 8, 0);
  }
}

uint8_t* CycleMessage::gatherBuffer(int nagents) {
  nagents_ = nagents;
  gathered_.assign(msg_.size() * static_cast<size_t>(nagents), 0);
  return gathered_.data();
}

void CycleMessage::combineGathered() {
  const size_t n = msg_.size();
  for (size_t i = 0; i < cache_bytes_ + AgreedParams::kWireBytes; ++i) {
    uint8_t m = gathered_[i];
    for (int a = 1; a < nagents_; ++a) m = std::min(m, gathered_[a * n + i]);
    msg_[i] = m;
  }
}

AgreedParams CycleMessage::agreed() const {
  return AgreedParams::decode(msg_.data() + cache_bytes_);
}

std::vector<uint8_t> CycleMessage::reducedCacheVector() const {
  return std::vector<uint8_t>(msg_.begin(), msg_.begin() + static_cast<ptrdiff_t>(cache_bytes_));
}

std::vector<const CycleMessage::InlineSlot*> CycleMessage::agreedInline() const {
  std::vector<const InlineSlot*> out;
  if (gathered_.empty()) return out;
  for (const auto& slot : slots_) {
    const size_t at = NegotiationState::kHeaderBytes + slot.bit;
    if (at < cache_bytes_ && msg_[at] == 1) out.push_back(&slot);
  }
  return out;
}

const uint8_t* CycleMessage::gatheredPayload(int agent, const InlineSlot& slot) const {
  return gathered_.data() + static_cast<size_t>(agent) * msg_.size() + head_ + slot.offset;
}

}  // namespace kolo
