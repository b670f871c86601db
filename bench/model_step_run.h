// kolo-bench --model-step FILE: runs one model's training-step gradient
// pattern over kolo and prints the step table (bench/model_step.h).
#pragma once

#include "bench/bench_options.h"

namespace kolo::bench {

// The whole run (kolo_init .. kolo_shutdown); returns the exit status:
// 0 ok, 1 wrong elements, 2 bad input or start failure, 3 a kolo error.
int modelStepMain(const BenchOptions& opts);

}  // namespace kolo::bench
