#include "agent/core/device_runtime.h"

namespace kolo {

DeviceRuntime& deviceRuntime() {
  static DeviceRuntime* rt = DeviceRuntime::create().release();
  return *rt;
}

}  // namespace kolo
