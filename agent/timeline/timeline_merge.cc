#include "agent/timeline/timeline_merge.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "agent/timeline/timeline.h"

namespace kolo::timeline {

namespace {

struct Input {
  std::string label;
  int64_t offset_us = 0;  // add to a ts to get wall-clock microseconds
  nlohmann::json events;
};

StatusOr<Input> readTrace(const std::string& path) {
  std::ifstream f(path);
  if (!f) return errnoStatus("timeline merge: cannot read " + path, errno);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return invalidArgument("timeline merge: " + path + " is not valid JSON");
  Input in;
  in.events = doc.is_array() ? doc : doc.value("traceEvents", nlohmann::json());
  if (!in.events.is_array()) return invalidArgument("timeline merge: " + path + " has no traceEvents array");
  in.label = std::filesystem::path(path).stem().string();
  bool anchored = false;
  for (const auto& e : in.events) {
    if (e.is_object() && e.value("name", "") == kClockAnchorName && e.contains("args")) {
      const auto& a = e["args"];
      in.offset_us = a.value("unix_us", int64_t{0}) - a.value("ts_us", int64_t{0});
      if (!a.value("label", std::string()).empty()) in.label = a["label"].get<std::string>();
      anchored = true;
      break;
    }
  }
  if (!anchored) {
    return invalidArgument("timeline merge: " + path +
                           " has no clock anchor (written by an older agent?); cannot align it");
  }
  return in;
}

}  // namespace

StatusOr<MergeStats> mergeTraceFiles(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty()) return invalidArgument("timeline merge: no input files");
  std::vector<Input> ins;
  for (const std::string& p : inputs) {
    auto in = readTrace(p);
    if (!in.isOk()) return in.status();
    ins.push_back(std::move(in).value());
  }
  int64_t base = std::numeric_limits<int64_t>::max();
  for (const Input& in : ins) {
    for (const auto& e : in.events) {
      if (e.is_object() && e.contains("ts") && e["ts"].is_number_integer()) {
        base = std::min(base, e["ts"].get<int64_t>() + in.offset_us);
      }
    }
  }
  if (base == std::numeric_limits<int64_t>::max()) base = 0;
  // Each input's pids move to their own range; pid 0 (cycle marks) too.
  constexpr int64_t kPidStride = 1'000'000;
  nlohmann::json out = nlohmann::json::array();
  MergeStats stats;
  stats.files = ins.size();
  for (size_t i = 0; i < ins.size(); ++i) {
    const Input& in = ins[i];
    const int64_t pid_base = static_cast<int64_t>(i) * kPidStride;
    bool named_zero = false;
    for (nlohmann::json e : in.events) {
      if (!e.is_object()) continue;
      if (e.value("name", "") == kClockAnchorName) continue;
      const int64_t pid = e.value("pid", int64_t{0});
      e["pid"] = pid_base + pid;
      if (e.contains("ts") && e["ts"].is_number_integer()) e["ts"] = e["ts"].get<int64_t>() + in.offset_us - base;
      if (e.value("ph", "") == "M" && e.value("name", "") == "process_name" && e.contains("args")) {
        e["args"]["name"] = in.label + ": " + e["args"].value("name", std::string());
        named_zero |= pid == 0;
      } else if (e.value("ph", "") == "M" && e.value("name", "") == "process_sort_index" && e.contains("args")) {
        e["args"]["sort_index"] = pid_base + e["args"].value("sort_index", int64_t{0});
      }
      out.push_back(std::move(e));
      ++stats.events;
    }
    if (!named_zero) {
      out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid_base}, {"args", {{"name", in.label}}}});
    }
  }
  std::string tmp = output + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return errnoStatus("timeline merge: cannot write " + tmp, errno);
    f << nlohmann::json{{"traceEvents", std::move(out)}}.dump(-1, ' ', false,
                                                             nlohmann::json::error_handler_t::replace)
      << '\n';
    if (!f.good()) return errnoStatus("timeline merge: cannot write " + tmp, errno);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, output, ec);
  if (ec) return internalError("timeline merge: cannot rename " + tmp + " to " + output + ": " + ec.message());
  return stats;
}

}  // namespace kolo::timeline
