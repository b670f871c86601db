// kolo-bench --model-step FILE: a model's parameter list, the
// layout of its gradients in one buffer, and the result row. Pure (no kolo
// calls), unit-tested; the measurement is in model_step_run.cc.
//
// FILE holds one tensor per line, "name count", in registration order
// (bench/models/*.txt, written by bench/models/gen_models.py); '#' starts a
// comment, blank lines are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kolo::bench {

struct ModelTensor {
  std::string name;
  uint64_t count = 0;  // elements
};

struct Model {
  std::string name;  // the file's stem: "resnet50"
  std::vector<ModelTensor> tensors;

  uint64_t totalCount() const;
};

// Longest tensor name accepted: kolo's limit is 255 bytes and kolo-bench adds
// a prefix.
inline constexpr size_t kMaxModelTensorName = 200;
// Every tensor of the step starts at a multiple of this many bytes.
inline constexpr uint64_t kModelTensorAlign = 64;

// Errors name the line: "line 3: expected 'name count'".
StatusOr<Model> parseModel(std::string_view text, std::string name);
// Reads and parses a file; the model's name is the file name without
// directory and extension.
StatusOr<Model> loadModel(const std::string& path);

// Byte offsets of the tensors in one buffer (each aligned to
// kModelTensorAlign) and the buffer's size.
struct ModelLayout {
  std::vector<uint64_t> offsets;
  uint64_t bytes = 0;
};
ModelLayout layoutModel(const Model& m, size_t elem_size);

// How the agent fuses, as far as the ranks can tell from the environment
// kolorun and the scripts pass to both agents and ranks:
// KOLO_FUSION_THRESHOLD_MB, else HOROVOD_FUSION_THRESHOLD (bytes), else the
// agent's default: "off", "64M", "default". With one agent "-1agent" is
// appended: fusion only applies to cross-agent jobs. No spaces (one column).
std::string fusionSetting(const char* kolo_mb, const char* horovod_bytes, int agents);

// One line of the model-step table.
struct StepRow {
  std::string model;
  uint64_t tensors = 0;
  uint64_t params = 0;
  uint64_t bytes = 0;      // params * element size
  std::string fusion;      // fusionSetting()
  double step_us = 0;      // median over steps of the slowest rank's step time
  double algbw = 0;        // bytes / step time, GB/s
  double busbw = 0;        // algbw * 2(n-1)/n
  double flat_us = 0;      // one allreduce of `bytes`, same statistic
  double flat_busbw = 0;
  std::optional<uint64_t> wrong;  // nullopt: not checked
  int steps = 0;           // timed steps
  int flat_iters = 0;

  double ratio() const { return flat_us > 0 ? step_us / flat_us : 0.0; }
};

// The column header (starts with '#'), aligned with formatStepRow.
std::string stepTableHeader();
std::string formatStepRow(const StepRow& r);
// The model-step target: step time within 1.25x of the flat-buffer allreduce.
inline constexpr double kStepTargetRatio = 1.25;
// "# Target: step/flat 1.10 <= 1.25: met" (or "MISSED by 12%").
std::string stepTargetLine(const StepRow& r);

}  // namespace kolo::bench
