// One typed configuration registry per process. Every knob has a name, a
// type, a default and a line of doc. Precedence, highest first:
//   --flag on the command line  >  KOLO_<NAME> environment  >  config file  >  default
// The config file is given by --config FILE (or KOLO_CONFIG) and holds
// `name = value` lines (# comments), or a JSON object {"name": value}.
// Horovod's environment names are accepted as aliases where the meaning is
// the same (e.g. HOROVOD_FUSION_THRESHOLD for fusion-threshold-mb, in bytes).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace kolo {

enum class KnobType { kBool, kInt, kDouble, kString };

struct Knob {
  std::string name;          // "fusion-threshold-mb"
  KnobType type;
  std::string default_value;
  std::string doc;
  std::string value;         // effective (textual)
  std::string source;        // "default" | "file" | "env" | "flag"
  std::string alias_env;     // optional Horovod-style env name
  // Converts an alias value to ours (e.g. bytes -> MiB); identity if empty.
  std::function<std::string(const std::string&)> alias_convert;
};

class Config {
 public:
  explicit Config(std::string program) : program_(std::move(program)) {}

  Config& define(std::string name, KnobType type, std::string default_value, std::string doc);
  Config& alias(const std::string& name, std::string env,
                std::function<std::string(const std::string&)> convert = nullptr);

  // Parses argv. Unknown --flags are an error. Arguments that are not flags
  // (and everything after "--") go to `positional` if given, else are errors.
  // Sets wantsHelp()/wantsDump() for --help / --dump-config.
  Status load(int argc, const char* const* argv, std::vector<std::string>* positional = nullptr);
  // Same with an explicit environment (for tests).
  Status loadWithEnv(int argc, const char* const* argv,
                     const std::map<std::string, std::string>& env,
                     std::vector<std::string>* positional = nullptr);

  bool getBool(const std::string& name) const;
  int64_t getInt(const std::string& name) const;
  double getDouble(const std::string& name) const;
  const std::string& getString(const std::string& name) const;
  const Knob* find(const std::string& name) const;
  // Overrides a value programmatically (source "override").
  Status set(const std::string& name, const std::string& value);

  bool wantsHelp() const { return help_; }
  bool wantsDump() const { return dump_; }
  bool wantsMarkdown() const { return markdown_; }
  std::string helpText() const;
  // `name = value  # source` for every knob.
  std::string dump() const;
  // A Markdown table of every knob (docs/config.md is generated from this).
  std::string markdown() const;
  static std::string envName(const std::string& knob);  // fusion-threshold-mb -> KOLO_FUSION_THRESHOLD_MB

 private:
  Status assign(Knob& k, const std::string& value, const std::string& source);
  Status loadFile(const std::string& path);

  std::string program_;
  std::vector<Knob> knobs_;
  std::map<std::string, size_t> index_;
  bool help_ = false;
  bool dump_ = false;
  bool markdown_ = false;
};

// Parses "1", "true", "yes", "on" (and their opposites).
StatusOr<bool> parseBool(const std::string& s);

// The process environment, name -> value (the first of a repeated name,
// as getenv gives it).
std::map<std::string, std::string> processEnvironment();

}  // namespace kolo
