// Shared by kolo's fuzz targets: a check that aborts (so libFuzzer keeps the
// input) and a quiet process (no logging: it would drown the fuzzer).
#pragma once

#include <google/protobuf/stubs/logging.h>

#include <cstdio>
#include <cstdlib>

#include "common/log.h"

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

namespace kolo::fuzz {

// kolo's loggers off; protobuf's complaints (e.g. invalid UTF-8 in a string
// field, which a fuzzer produces all the time) dropped.
inline void quietInit() {
  log::init("kolo-fuzz", "off");
  google::protobuf::SetLogHandler(nullptr);
}

}  // namespace kolo::fuzz
