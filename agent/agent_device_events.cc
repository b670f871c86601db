// More device event pairs for a trainer whose pairs are all in flight
// (docs/gpu.md, "More than 64 device ops in flight"): the DeviceEvents frame.
#include "agent/agent.h"
#include "common/log.h"

namespace kolo {

void Agent::deviceEventsOnLoop(ClientConn& c, const ipc::DeviceEvents& e) {
  if (!c.device) {
    refuseFrameOnLoop(
        c,
        unavailable("DeviceEvents: this trainer has no device arena (" +
                    (c.device_error.empty() ? std::string("none asked for") : c.device_error) +
                    ")"),
        "DeviceEvents", false);
    return;
  }
  auto handles = c.device->addEvents(e.handles());
  if (!handles.isOk()) {
    refuseFrameOnLoop(c, handles.status().withContext("DeviceEvents"), "DeviceEvents", false);
    return;
  }
  ipc::AgentFrame f;
  f.mutable_device_events_granted()->set_handles(*handles);
  f.mutable_device_events_granted()->set_total(c.device->events());
  (void)c.send(f);
  log::get("agent.device")
      ->info("pid {}: {} device event pairs in all", c.pid(), c.device->events());
}

}  // namespace kolo
