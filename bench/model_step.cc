#include "bench/model_step.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace kolo::bench {

namespace {
// One format for the header and the rows, so that they line up.
constexpr const char* kStepHeaderFormat = "#%13s%9s%14s%14s%16s%13s%13s%13s%13s%12s%11s%8s";
}  // namespace

std::string stepTableHeader() {
  char line[512];
  std::snprintf(line, sizeof(line), kStepHeaderFormat, "model", "tensors", "params", "size(B)",
                "fusion", "step(us)", "algbw(GB/s)", "busbw(GB/s)", "flat(us)", "flat busbw",
                "step/flat", "#wrong");
  return line;
}

uint64_t Model::totalCount() const {
  uint64_t n = 0;
  for (const ModelTensor& t : tensors) n += t.count;
  return n;
}

StatusOr<Model> parseModel(std::string_view text, std::string name) {
  Model m;
  m.name = std::move(name);
  std::set<std::string> seen;
  std::istringstream in{std::string(text)};
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string where = "line " + std::to_string(lineno) + ": ";
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string tname, count_s, extra;
    if (!(fields >> tname)) continue;  // blank or comment only
    if (!(fields >> count_s) || (fields >> extra)) {
      return invalidArgument(where + "expected 'name count', got '" + line + "'");
    }
    if (tname.size() > kMaxModelTensorName) {
      return invalidArgument(where + "tensor name longer than " +
                             std::to_string(kMaxModelTensorName) + " bytes");
    }
    uint64_t count = 0;
    for (char c : count_s) {
      if (c < '0' || c > '9' || count > (UINT64_MAX - 9) / 10) {
        return invalidArgument(where + "bad element count '" + count_s + "'");
      }
      count = count * 10 + static_cast<uint64_t>(c - '0');
    }
    if (count == 0) return invalidArgument(where + "tensor '" + tname + "' has no elements");
    if (!seen.insert(tname).second) {
      return invalidArgument(where + "tensor '" + tname + "' is listed twice");
    }
    m.tensors.push_back({tname, count});
  }
  if (m.tensors.empty()) return invalidArgument("no tensors in the model file");
  return m;
}

StatusOr<Model> loadModel(const std::string& path) {
  std::ifstream f(path);
  if (!f) return invalidArgument("cannot read model file '" + path + "'");
  std::stringstream buf;
  buf << f.rdbuf();
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (auto dot = base.find('.'); dot != std::string::npos && dot > 0) base.resize(dot);
  auto m = parseModel(buf.str(), base);
  if (!m.isOk()) return invalidArgument(path + ": " + m.status().message());
  return m;
}

ModelLayout layoutModel(const Model& m, size_t elem_size) {
  ModelLayout l;
  uint64_t off = 0;
  for (const ModelTensor& t : m.tensors) {
    off = (off + kModelTensorAlign - 1) / kModelTensorAlign * kModelTensorAlign;
    l.offsets.push_back(off);
    off += t.count * elem_size;
  }
  l.bytes = off;
  return l;
}

std::string fusionSetting(const char* kolo_mb, const char* horovod_bytes, int agents) {
  std::string s;
  if (kolo_mb != nullptr && *kolo_mb != '\0') {
    s = std::string(kolo_mb) == "0" ? "off" : std::string(kolo_mb) + "M";
  } else if (horovod_bytes != nullptr && *horovod_bytes != '\0') {
    char* end = nullptr;
    unsigned long long b = std::strtoull(horovod_bytes, &end, 10);
    s = b == 0 ? "off" : std::to_string(b >> 20) + "M";
  } else {
    s = "default";
  }
  if (agents <= 1) s += "-1agent";
  return s;
}

std::string formatStepRow(const StepRow& r) {
  char wrong[32];
  if (r.wrong) {
    std::snprintf(wrong, sizeof(wrong), "%8" PRIu64, *r.wrong);
  } else {
    std::snprintf(wrong, sizeof(wrong), "%8s", "N/A");
  }
  char line[512];
  std::snprintf(line, sizeof(line),
                "%14s%9" PRIu64 "%14" PRIu64 "%14" PRIu64 "%16s%13.1f%13.2f%13.2f%13.1f%12.2f%11.2f%s",
                r.model.c_str(), r.tensors, r.params, r.bytes, r.fusion.c_str(), r.step_us, r.algbw,
                r.busbw, r.flat_us, r.flat_busbw, r.ratio(), wrong);
  return line;
}

std::string stepTargetLine(const StepRow& r) {
  char line[256];
  double ratio = r.ratio();
  if (ratio <= kStepTargetRatio) {
    std::snprintf(line, sizeof(line), "# Target: step/flat %.2f <= %.2f: met", ratio,
                  kStepTargetRatio);
  } else {
    std::snprintf(line, sizeof(line), "# Target: step/flat %.2f <= %.2f: MISSED by %.0f%%", ratio,
                  kStepTargetRatio, (ratio / kStepTargetRatio - 1.0) * 100.0);
  }
  return line;
}

}  // namespace kolo::bench
