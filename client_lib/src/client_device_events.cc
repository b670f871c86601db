// Client: more device event pairs while all are in flight (docs/gpu.md,
// "More than 64 device ops in flight"): new in_ready events, the
// DeviceEvents frame, the agent's out_ready handles back. One thread at a
// time; the others find the pool grown and go on.
#include "client.h"
#include "common/log.h"
#include "kolo/proto/ipc.pb.h"

namespace kolo {

namespace {
std::shared_ptr<spdlog::logger> logger() {
  static auto l = log::get("client.device");
  return l;
}
}  // namespace

bool Client::growDeviceEvents() {
  std::lock_guard<std::mutex> grow(grow_mu_);
  if (!device_->eventsExhausted()) return true;  // grown by another thread meanwhile
  auto handles = device_->newEvents();
  if (!handles.isOk()) {
    logger()->warn("no more device event pairs: {}", handles.status().message());
    device_->dropNewEvents();
    return false;
  }
  uint64_t before = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!usableLocked().isOk()) return false;
    ipc::ClientFrame f;
    f.mutable_device_events()->set_handles(*handles);
    Status st = sendFrame(sock_.get(), f);
    if (!st.isOk()) {
      device_->dropNewEvents();
      return false;
    }
    before = device_event_replies_;
  }
  constexpr auto kReplyTimeout = std::chrono::seconds(10);
  progressUntil([&] { return device_event_replies_ != before || !failed_.isOk(); },
                Clock::now() + kReplyTimeout, std::chrono::milliseconds(50));
  StatusOr<std::string> reply{std::string()};
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (device_event_replies_ == before) {
      reply = timedOut("the kolo agent did not answer within 10 s");
    } else {
      reply = device_events_reply_;
    }
  }
  Status st = reply.isOk() ? device_->attachEvents(*reply) : reply.status();
  if (!st.isOk()) {
    logger()->warn(
        "the kolo agent granted no more device event pairs ({}); device submissions wait for "
        "pairs in flight",
        st.message());
    device_->dropNewEvents();
    return false;
  }
  logger()->debug("{} device event pairs", device_->eventPairs());
  return true;
}

}  // namespace kolo
