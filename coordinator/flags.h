// kolo-coordinator's configuration knobs (kolo::Config registry).
#pragma once

#include <string>

#include "common/config.h"
#include "common/status.h"
#include "coordinator/server.h"

namespace kolo::coordinator {

void defineFlags(Config& config);
// Reads and checks the knobs defined by defineFlags().
StatusOr<ServerOptions> serverOptionsFrom(const Config& config);

}  // namespace kolo::coordinator
