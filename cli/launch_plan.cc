#include "cli/launch_plan.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>

#include "common/fd.h"

namespace kolo::cli {

namespace {

std::string_view trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

StatusOr<int> parseSlots(std::string_view text, std::string_view context) {
  int n = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || n < 1) {
    return invalidArgument(std::string(context) + ": slots must be a positive integer, got '" +
                           std::string(text) + "'");
  }
  return n;
}

std::string hex(const unsigned char* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s += kDigits[p[i] >> 4];
    s += kDigits[p[i] & 15];
  }
  return s;
}

}  // namespace

StatusOr<std::vector<HostSlots>> parseHostList(std::string_view spec) {
  std::vector<HostSlots> hosts;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string_view item = trim(spec.substr(pos, comma == std::string_view::npos ? spec.npos : comma - pos));
    if (item.empty()) return invalidArgument("-H: empty host in '" + std::string(spec) + "'");
    HostSlots h;
    size_t colon = item.rfind(':');
    if (colon == std::string_view::npos) {
      h.host = std::string(item);
    } else {
      h.host = std::string(trim(item.substr(0, colon)));
      ASSIGN_OR_RETURN(h.slots, parseSlots(trim(item.substr(colon + 1)), "-H " + std::string(item)));
    }
    if (h.host.empty()) return invalidArgument("-H: empty host name in '" + std::string(item) + "'");
    hosts.push_back(std::move(h));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return hosts;
}

StatusOr<std::vector<HostSlots>> parseHostfile(std::string_view text, std::string_view origin) {
  std::vector<HostSlots> hosts;
  int lineno = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? text.npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++lineno;
    if (size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    std::string where = std::string(origin) + ":" + std::to_string(lineno);
    size_t sp = line.find_first_of(" \t");
    HostSlots h;
    h.host = std::string(line.substr(0, sp));
    if (sp != std::string_view::npos) {
      std::string_view rest = trim(line.substr(sp));
      constexpr std::string_view kSlots = "slots";
      if (rest.substr(0, kSlots.size()) != kSlots) {
        return invalidArgument(where + ": expected 'host slots=N', got '" + std::string(line) + "'");
      }
      rest = trim(rest.substr(kSlots.size()));
      if (rest.empty() || rest.front() != '=') {
        return invalidArgument(where + ": expected 'host slots=N', got '" + std::string(line) + "'");
      }
      ASSIGN_OR_RETURN(h.slots, parseSlots(trim(rest.substr(1)), where));
    }
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) return invalidArgument(std::string(origin) + ": no hosts in the hostfile");
  return hosts;
}

std::vector<int> evenBlocks(int np, int k) {
  std::vector<int> blocks(static_cast<size_t>(k), np / k);
  for (int i = 0; i < np % k; ++i) ++blocks[static_cast<size_t>(i)];
  return blocks;
}

StatusOr<std::vector<int>> fillSlots(int np, const std::vector<int>& slots) {
  long total = 0;
  for (int s : slots) total += s;
  if (np > total) {
    return invalidArgument("-np " + std::to_string(np) + " is more than the " + std::to_string(total) +
                           " slots of the hosts given");
  }
  std::vector<int> used;
  int left = np;
  for (int s : slots) {
    if (left == 0) break;
    int n = std::min(s, left);
    used.push_back(n);
    left -= n;
  }
  return used;
}

std::vector<RankPlacement> placeRanks(const std::vector<int>& ranks_per_node) {
  std::vector<RankPlacement> out;
  int rank = 0;
  for (size_t node = 0; node < ranks_per_node.size(); ++node) {
    int local_size = ranks_per_node[node];
    for (int lr = 0; lr < local_size; ++lr) {
      RankPlacement p;
      p.rank = rank++;
      p.node = static_cast<int>(node);
      p.local_rank = lr;
      p.local_size = local_size;
      for (size_t other = 0; other < ranks_per_node.size(); ++other) {
        if (ranks_per_node[other] > lr) {
          if (other < node) ++p.cross_rank;
          ++p.cross_size;
        }
      }
      out.push_back(p);
    }
  }
  return out;
}

StatusOr<JobIdentity> newJobIdentity() {
  UniqueFd fd(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errnoStatus("cannot open /dev/urandom", errno);
  unsigned char buf[22];
  size_t got = 0;
  while (got < sizeof buf) {
    ssize_t n = ::read(fd.get(), buf + got, sizeof buf - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errnoStatus("cannot read /dev/urandom", n < 0 ? errno : EIO);
    got += static_cast<size_t>(n);
  }
  return JobIdentity{"job-" + hex(buf, 6), hex(buf + 6, 16)};
}

std::vector<std::pair<std::string, std::string>> rankEnv(const LaunchPlan& plan, int rank) {
  const RankPlacement& p = plan.ranks.at(static_cast<size_t>(rank));
  const NodeEndpoint& node = plan.nodes.at(static_cast<size_t>(p.node));
  std::vector<std::pair<std::string, std::string>> env;
  auto put = [&](std::string k, std::string v) { env.emplace_back(std::move(k), std::move(v)); };
  put("KOLO_AGENT_SOCKET", node.agent_socket);
  put("KOLO_JOB_ID", plan.job.job_id);
  put("KOLO_JOB_TOKEN", plan.job.token);
  const std::pair<const char*, int> numbers[] = {
      {"RANK", p.rank},          {"SIZE", plan.size()},
      {"LOCAL_RANK", p.local_rank}, {"LOCAL_SIZE", p.local_size},
      {"CROSS_RANK", p.cross_rank}, {"CROSS_SIZE", p.cross_size}};
  for (auto& [name, value] : numbers) put(std::string("KOLO_") + name, std::to_string(value));
  put("KOLO_START_TIMEOUT", std::to_string(plan.start_timeout_s));
  for (auto& [name, value] : numbers) put(std::string("HOROVOD_") + name, std::to_string(value));
  // torchrun's variables (docs/kolorun.md): a torchrun script runs unchanged.
  put("RANK", std::to_string(p.rank));
  put("LOCAL_RANK", std::to_string(p.local_rank));
  put("WORLD_SIZE", std::to_string(plan.size()));
  put("LOCAL_WORLD_SIZE", std::to_string(p.local_size));
  put("GROUP_RANK", std::to_string(p.node));
  put("GROUP_WORLD_SIZE", std::to_string(plan.nodes.size()));
  put("ROLE_RANK", std::to_string(p.rank));
  put("ROLE_WORLD_SIZE", std::to_string(plan.size()));
  if (plan.master_port > 0) {
    put("MASTER_ADDR", plan.master_addr);
    put("MASTER_PORT", std::to_string(plan.master_port));
  }
  if (!node.agent_rpc.empty()) put("KOLO_AGENT_RPC", node.agent_rpc);
  if (!plan.coordinator.empty()) put("KOLO_COORDINATOR", plan.coordinator);
  for (auto& [k, v] : plan.extra_env) put(k, v);
  for (auto& [k, v] : plan.user_env) {
    auto same = std::find_if(env.begin(), env.end(), [&k = k](const auto& kv) { return kv.first == k; });
    if (same != env.end()) {
      same->second = v;
    } else {
      put(k, v);
    }
  }
  return env;
}

namespace {
int freeLocalTcpPort() {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return 0;
  }
  return ntohs(a.sin_port);
}
}  // namespace

void setTorchrunMaster(LaunchPlan& plan, const std::map<std::string, std::string>& env) {
  auto addr = env.find("MASTER_ADDR");
  auto port = env.find("MASTER_PORT");
  if (addr != env.end() && port != env.end() && !addr->second.empty()) {
    int v = 0;
    auto [end, ec] =
        std::from_chars(port->second.data(), port->second.data() + port->second.size(), v);
    if (ec == std::errc() && end == port->second.data() + port->second.size() && v > 0 &&
        v < 65536) {
      plan.master_addr = addr->second;
      plan.master_port = v;
      return;
    }
  }
  if (plan.nodes.empty()) return;
  const NodeEndpoint& n0 = plan.nodes[0];
  bool all_local = std::all_of(plan.nodes.begin(), plan.nodes.end(),
                               [](const NodeEndpoint& n) { return n.local; });
  if (all_local) {
    plan.master_addr = "127.0.0.1";
  } else if (!n0.local) {
    plan.master_addr = n0.host;
  } else {
    char host[256] = {};
    plan.master_addr = ::gethostname(host, sizeof host - 1) == 0 ? host : "127.0.0.1";
  }
  if (n0.local) {
    plan.master_port = freeLocalTcpPort();
  } else {
    unsigned h = 0;
    for (char c : plan.job.job_id) h = h * 131u + static_cast<unsigned char>(c);
    plan.master_port = 29500 + static_cast<int>(h % 1000u);
  }
}

bool isSecretVariable(std::string_view name) {
  auto ends = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  return ends("_TOKEN") || name.find("SECRET") != std::string_view::npos ||
         name.find("PASSWORD") != std::string_view::npos;
}

std::vector<std::string> sshArgv(const LaunchPlan& plan, const std::string& host,
                                 const std::vector<std::pair<std::string, std::string>>& env) {
  // The remote shell reads "NAME=value" lines from stdin (secretStdin: the
  // secrets, never on a command line) and exports them, then runs the
  // command under the other variables. ssh joins its arguments with spaces
  // into one remote shell command line, so the script is one quoted word
  // and every word inside it is quoted for the shell that runs it.
  std::string script = "while IFS= read -r kolo_kv; do export \"$kolo_kv\"; done; unset kolo_kv; ";
  if (!plan.wdir.empty()) script += "cd " + shellQuote(plan.wdir) + " || exit 127; ";
  script += "exec env";
  for (auto& [k, v] : env) {
    if (!isSecretVariable(k)) script += " " + shellQuote(k + "=" + v);
  }
  for (const std::string& word : plan.command) script += " " + shellQuote(word);
  std::vector<std::string> argv = {"ssh", "-o", "BatchMode=yes"};
  argv.insert(argv.end(), plan.ssh_options.begin(), plan.ssh_options.end());
  argv.insert(argv.end(), {host, "sh", "-c", shellQuote(script)});
  return argv;
}

std::string secretStdin(const std::vector<std::pair<std::string, std::string>>& env) {
  std::string lines;
  for (auto& [k, v] : env) {
    // One line each: a value cannot hold a newline (the job token is hex).
    if (isSecretVariable(k) && v.find('\n') == std::string::npos) lines += k + "=" + v + "\n";
  }
  return lines;
}

std::vector<std::string> rankArgv(const LaunchPlan& plan, int rank) {
  const RankPlacement& p = plan.ranks.at(static_cast<size_t>(rank));
  const NodeEndpoint& node = plan.nodes.at(static_cast<size_t>(p.node));
  if (node.local) return plan.command;
  return sshArgv(plan, node.host, rankEnv(plan, rank));
}

std::string rankStdin(const LaunchPlan& plan, int rank) {
  const RankPlacement& p = plan.ranks.at(static_cast<size_t>(rank));
  if (plan.nodes.at(static_cast<size_t>(p.node)).local) return "";
  return secretStdin(rankEnv(plan, rank));
}

std::string shellQuote(std::string_view s) {
  bool safe = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("@%_-+=:,./").find(c) != std::string_view::npos;
  });
  if (safe) return std::string(s);
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  q += "'";
  return q;
}

bool isLocalHost(std::string_view host) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return true;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return false;
  std::string_view full(name);
  std::string_view short_name = full.substr(0, full.find('.'));
  return host == full || host == short_name;
}

std::string embeddedAgentId(int index, int k) {
  std::string n = std::to_string(index);
  size_t width = k > 10 ? std::to_string(k - 1).size() : 0;
  if (n.size() < width) n.insert(0, width - n.size(), '0');
  return "node" + n;
}

}  // namespace kolo::cli
