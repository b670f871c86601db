#include "common/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

extern char** environ;

namespace kolo {

namespace {
std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}
const char* typeName(KnobType t) {
  switch (t) {
    case KnobType::kBool: return "bool";
    case KnobType::kInt: return "int";
    case KnobType::kDouble: return "double";
    case KnobType::kString: return "string";
  }
  return "?";
}
}  // namespace

StatusOr<bool> parseBool(const std::string& s0) {
  std::string s = s0;
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) return false;
  return invalidArgument("expected a boolean (true/false/1/0), got '" + s0 + "'");
}

std::string Config::envName(const std::string& knob) {
  std::string e = "KOLO_";
  for (char c : knob) e += (c == '-' || c == '.') ? '_' : static_cast<char>(::toupper(c));
  return e;
}

Config& Config::define(std::string name, KnobType type, std::string default_value,
                       std::string doc) {
  Knob k{name, type, default_value, std::move(doc), default_value, "default", "", nullptr};
  index_[name] = knobs_.size();
  knobs_.push_back(std::move(k));
  return *this;
}

Config& Config::alias(const std::string& name, std::string env,
                      std::function<std::string(const std::string&)> convert) {
  auto it = index_.find(name);
  if (it != index_.end()) {
    knobs_[it->second].alias_env = std::move(env);
    knobs_[it->second].alias_convert = std::move(convert);
  }
  return *this;
}

Status Config::assign(Knob& k, const std::string& raw, const std::string& source) {
  std::string v = trim(raw);
  std::string where = source == "flag" ? "--" + k.name : k.name + " (from " + source + ")";
  switch (k.type) {
    case KnobType::kBool: {
      auto b = parseBool(v);
      if (!b.isOk()) return invalidArgument(where + ": " + b.status().message());
      v = *b ? "true" : "false";
      break;
    }
    case KnobType::kInt: {
      char* end = nullptr;
      errno = 0;
      long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0) {
        return invalidArgument(where + ": expected an integer, got '" + raw + "'");
      }
      v = std::to_string(x);
      break;
    }
    case KnobType::kDouble: {
      char* end = nullptr;
      std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0') {
        return invalidArgument(where + ": expected a number, got '" + raw + "'");
      }
      break;
    }
    case KnobType::kString: break;
  }
  k.value = v;
  k.source = source;
  return okStatus();
}

Status Config::loadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalidArgument("cannot read config file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  std::string first = trim(text);
  if (!first.empty() && first[0] == '{') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      return invalidArgument("config file " + path + " is not valid JSON: " + e.what());
    }
    for (auto& [key, val] : j.items()) {
      auto it = index_.find(key);
      if (it == index_.end()) return invalidArgument("config file " + path + ": unknown key '" + key + "'");
      std::string s = val.is_string() ? val.get<std::string>() : val.dump();
      RETURN_IF_ERROR(assign(knobs_[it->second], s, "file"));
    }
    return okStatus();
  }
  std::string line;
  int lineno = 0;
  std::istringstream lines(text);
  while (std::getline(lines, line)) {
    ++lineno;
    auto hash = line.find('#');
    if (hash != std::string::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    auto eq = line.find_first_of("=:");
    if (eq == std::string::npos) {
      return invalidArgument(path + ":" + std::to_string(lineno) + ": expected 'name = value'");
    }
    std::string key = trim(line.substr(0, eq));
    std::string val = trim(line.substr(eq + 1));
    if (val.size() >= 2 && val.front() == '"' && val.back() == '"') val = val.substr(1, val.size() - 2);
    auto it = index_.find(key);
    if (it == index_.end()) {
      return invalidArgument(path + ":" + std::to_string(lineno) + ": unknown key '" + key + "'");
    }
    RETURN_IF_ERROR(assign(knobs_[it->second], val, "file"));
  }
  return okStatus();
}

std::map<std::string, std::string> processEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string s(*e);
    auto eq = s.find('=');
    if (eq != std::string::npos) env.emplace(s.substr(0, eq), s.substr(eq + 1));
  }
  return env;
}

Status Config::load(int argc, const char* const* argv, std::vector<std::string>* positional) {
  return loadWithEnv(argc, argv, processEnvironment(), positional);
}

Status Config::loadWithEnv(int argc, const char* const* argv,
                           const std::map<std::string, std::string>& env,
                           std::vector<std::string>* positional) {
  // Pass 1: split flags from positionals; find --config.
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_file;
  if (auto it = env.find("KOLO_CONFIG"); it != env.end()) config_file = it->second;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (int j = i + 1; j < argc; ++j) {
        if (positional == nullptr) return invalidArgument(std::string("unexpected argument '") + argv[j] + "'");
        positional->push_back(argv[j]);
      }
      break;
    }
    if (a.rfind("--", 0) != 0) {
      if (positional == nullptr) return invalidArgument("unexpected argument '" + a + "'");
      // The first positional ends flag parsing (kolorun: the command follows).
      for (int j = i; j < argc; ++j) positional->push_back(argv[j]);
      break;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "help") { help_ = true; continue; }
    if (name == "dump-config") { dump_ = true; continue; }
    if (name == "config-markdown") { markdown_ = true; continue; }
    if (name == "config") {
      if (!has_value) {
        if (i + 1 >= argc) return invalidArgument("--config needs a file name");
        value = argv[++i];
      }
      config_file = value;
      continue;
    }
    auto it = index_.find(name);
    if (it == index_.end()) {
      return invalidArgument("unknown flag --" + name + " (see " + program_ + " --help)");
    }
    Knob& k = knobs_[it->second];
    if (!has_value) {
      if (k.type == KnobType::kBool &&
          (i + 1 >= argc || !parseBool(argv[i + 1]).isOk() || std::string(argv[i + 1]).empty())) {
        value = "true";
      } else {
        if (i + 1 >= argc) return invalidArgument("--" + name + " needs a value");
        value = argv[++i];
      }
    }
    flags.emplace_back(name, value);
  }
  if (!config_file.empty()) RETURN_IF_ERROR(loadFile(config_file));
  for (Knob& k : knobs_) {
    if (!k.alias_env.empty()) {
      if (auto it = env.find(k.alias_env); it != env.end()) {
        std::string v = k.alias_convert ? k.alias_convert(it->second) : it->second;
        RETURN_IF_ERROR(assign(k, v, "env " + k.alias_env));
      }
    }
    if (auto it = env.find(envName(k.name)); it != env.end()) {
      RETURN_IF_ERROR(assign(k, it->second, "env " + envName(k.name)));
    }
  }
  for (auto& [name, value] : flags) RETURN_IF_ERROR(assign(knobs_[index_[name]], value, "flag"));
  return okStatus();
}

const Knob* Config::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &knobs_[it->second];
}

static const Knob& mustFind(const Config& c, const std::string& name) {
  const Knob* k = c.find(name);
  if (k == nullptr) {
    std::fprintf(stderr, "kolo: internal error: undefined config knob '%s'\n", name.c_str());
    std::abort();
  }
  return *k;
}

bool Config::getBool(const std::string& name) const { return mustFind(*this, name).value == "true"; }
int64_t Config::getInt(const std::string& name) const {
  return std::strtoll(mustFind(*this, name).value.c_str(), nullptr, 10);
}
double Config::getDouble(const std::string& name) const {
  return std::strtod(mustFind(*this, name).value.c_str(), nullptr);
}
const std::string& Config::getString(const std::string& name) const {
  return mustFind(*this, name).value;
}

Status Config::set(const std::string& name, const std::string& value) {
  auto it = index_.find(name);
  if (it == index_.end()) return invalidArgument("unknown config knob '" + name + "'");
  return assign(knobs_[it->second], value, "override");
}

std::string Config::helpText() const {
  std::ostringstream o;
  o << "Usage: " << program_ << " [--flag=value ...]\n\n"
    << "Every flag can also be set as KOLO_<NAME> in the environment or in a config file\n"
    << "(--config FILE). Precedence: flag > environment > file > default.\n\n";
  for (const Knob& k : knobs_) {
    o << "  --" << k.name << " <" << typeName(k.type) << ">  (default: "
      << (k.default_value.empty() ? "\"\"" : k.default_value) << "; env " << envName(k.name);
    if (!k.alias_env.empty()) o << ", " << k.alias_env;
    o << ")\n      " << k.doc << "\n";
  }
  o << "  --config FILE\n      Read settings from FILE (name = value lines, or JSON).\n"
    << "  --dump-config\n      Print the effective configuration and exit.\n"
    << "  --config-markdown\n      Print this reference as a Markdown table and exit.\n";
  return o.str();
}

std::string Config::dump() const {
  std::ostringstream o;
  for (const Knob& k : knobs_) {
    o << k.name << " = " << (k.type == KnobType::kString ? "\"" + k.value + "\"" : k.value)
      << "  # " << k.source << "\n";
  }
  return o.str();
}

std::string Config::markdown() const {
  std::ostringstream o;
  o << "| flag | env | type | default | description |\n|---|---|---|---|---|\n";
  for (const Knob& k : knobs_) {
    o << "| `--" << k.name << "` | `" << envName(k.name) << "`";
    if (!k.alias_env.empty()) o << " (`" << k.alias_env << "`)";
    o << " | " << typeName(k.type) << " | `" << k.default_value << "` | " << k.doc << " |\n";
  }
  return o.str();
}

}  // namespace kolo
