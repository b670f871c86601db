// An elastic job's bounds, as the first trainer's Hello gave them and the
// agent passes them on at the join (docs/elastic.md).
#pragma once

#include <cstdint>

namespace kolo {

struct ElasticParams {
  int min_size = 0;        // 0: not elastic
  int max_size = 0;        // 0: no limit
  int64_t timeout_ms = 0;  // 0: the coordinator's default
  bool enabled() const { return min_size > 0; }
};

}  // namespace kolo
