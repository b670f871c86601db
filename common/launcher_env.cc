#include "common/launcher_env.h"

#include <charconv>

namespace kolo {

namespace {

constexpr size_t kMaxHosts = 1'000'000;

StatusOr<long> parseNumber(std::string_view text, std::string_view what) {
  long v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < 0) {
    return invalidArgument(std::string(what) + ": '" + std::string(text) + "' is not a number");
  }
  return v;
}

std::string padded(long v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// "1-3,7" (inside one bracket pair) -> "1" "2" "3" "7", zero padding kept.
StatusOr<std::vector<std::string>> expandRanges(std::string_view body, std::string_view list) {
  std::vector<std::string> out;
  const std::string what = "host list '" + std::string(list) + "'";
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    std::string_view item =
        body.substr(pos, comma == std::string_view::npos ? body.npos : comma - pos);
    size_t dash = item.find('-');
    std::string_view lo_text = item.substr(0, dash);
    ASSIGN_OR_RETURN(long lo, parseNumber(lo_text, what));
    long hi = lo;
    if (dash != std::string_view::npos) {
      ASSIGN_OR_RETURN(hi, parseNumber(item.substr(dash + 1), what));
      if (hi < lo)
        return invalidArgument(what + ": range " + std::string(item) + " runs backwards");
    }
    if (static_cast<size_t>(hi - lo) >= kMaxHosts)
      return invalidArgument(what + ": more than 1000000 hosts");
    for (long v = lo; v <= hi; ++v) out.push_back(padded(v, lo_text.size()));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

// One name with bracket groups, "r[1-2]n[01-02]", as a product.
Status expandOne(std::string_view name, std::string_view list, std::vector<std::string>& out) {
  std::vector<std::string> partial = {""};
  size_t pos = 0;
  while (pos < name.size()) {
    size_t open = name.find('[', pos);
    std::string_view literal =
        name.substr(pos, open == std::string_view::npos ? name.npos : open - pos);
    for (std::string& p : partial) p.append(literal);
    if (open == std::string_view::npos) break;
    size_t close = name.find(']', open);
    if (close == std::string_view::npos) {
      return invalidArgument("host list '" + std::string(list) + "': '[' without ']'");
    }
    ASSIGN_OR_RETURN(std::vector<std::string> values,
                     expandRanges(name.substr(open + 1, close - open - 1), list));
    if (partial.size() * values.size() > kMaxHosts) {
      return invalidArgument("host list '" + std::string(list) + "': more than 1000000 hosts");
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * values.size());
    for (const std::string& p : partial) {
      for (const std::string& v : values) next.push_back(p + v);
    }
    partial = std::move(next);
    pos = close + 1;
  }
  if (partial.size() == 1 && partial[0].empty()) {
    return invalidArgument("host list '" + std::string(list) + "': empty host name");
  }
  if (out.size() + partial.size() > kMaxHosts) {
    return invalidArgument("host list '" + std::string(list) + "': more than 1000000 hosts");
  }
  out.insert(out.end(), partial.begin(), partial.end());
  return okStatus();
}

std::optional<std::string> get(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

StatusOr<int> requireInt(const std::map<std::string, std::string>& env, const char* name,
                         const char* who) {
  auto v = get(env, name);
  if (!v) return invalidArgument(std::string(name) + " is not set, but " + who + " is");
  ASSIGN_OR_RETURN(long n, parseNumber(*v, name));
  if (n > (1 << 24)) return invalidArgument(std::string(name) + " is too large: " + *v);
  return static_cast<int>(n);
}

Status checkIdentity(const LauncherIdentity& id, const std::string& prefix) {
  if (id.size < 1) return invalidArgument(prefix + ": the job has no tasks");
  if (id.rank >= id.size) {
    return invalidArgument(prefix + ": rank " + std::to_string(id.rank) +
                           " is not below the size " + std::to_string(id.size));
  }
  if (id.local_size < 1 || id.local_size > id.size || id.local_rank >= id.local_size) {
    return invalidArgument(prefix + ": local rank " + std::to_string(id.local_rank) +
                           " of local size " + std::to_string(id.local_size) +
                           " does not fit a job of " + std::to_string(id.size));
  }
  return okStatus();
}

StatusOr<LauncherIdentity> openMpiIdentity(const std::map<std::string, std::string>& env) {
  const char* who = "OMPI_COMM_WORLD_RANK";
  LauncherIdentity id;
  id.launcher = "openmpi";
  ASSIGN_OR_RETURN(id.rank, requireInt(env, "OMPI_COMM_WORLD_RANK", who));
  ASSIGN_OR_RETURN(id.size, requireInt(env, "OMPI_COMM_WORLD_SIZE", who));
  ASSIGN_OR_RETURN(id.local_rank, requireInt(env, "OMPI_COMM_WORLD_LOCAL_RANK", who));
  ASSIGN_OR_RETURN(id.local_size, requireInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE", who));
  if (get(env, "OMPI_COMM_WORLD_NODE_RANK")) {
    ASSIGN_OR_RETURN(id.node, requireInt(env, "OMPI_COMM_WORLD_NODE_RANK", who));
  }
  auto job = get(env, "PMIX_NAMESPACE");
  if (!job) job = get(env, "OMPI_MCA_ess_base_jobid");
  if (!job) {
    return invalidArgument(
        "OMPI_COMM_WORLD_RANK is set but neither PMIX_NAMESPACE nor OMPI_MCA_ess_base_jobid names "
        "the job "
        "(set KOLO_JOB_ID to the same value on every rank)");
  }
  id.job_id = "ompi-" + *job;
  RETURN_IF_ERROR(checkIdentity(id, "Open MPI's OMPI_COMM_WORLD_* variables"));
  return id;
}

StatusOr<LauncherIdentity> slurmIdentity(const std::map<std::string, std::string>& env) {
  const char* who = "SLURM_PROCID";
  LauncherIdentity id;
  id.launcher = "slurm";
  ASSIGN_OR_RETURN(id.rank, requireInt(env, "SLURM_PROCID", who));
  const char* ntasks = get(env, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  ASSIGN_OR_RETURN(id.size, requireInt(env, ntasks, who));
  ASSIGN_OR_RETURN(id.local_rank, requireInt(env, "SLURM_LOCALID", who));
  ASSIGN_OR_RETURN(id.node, requireInt(env, "SLURM_NODEID", who));
  auto per_node = get(env, "SLURM_STEP_TASKS_PER_NODE");
  if (!per_node) per_node = get(env, "SLURM_TASKS_PER_NODE");
  if (!per_node)
    return invalidArgument("SLURM_STEP_TASKS_PER_NODE is not set, but SLURM_PROCID is");
  ASSIGN_OR_RETURN(std::vector<int> tasks, expandSlurmTasksPerNode(*per_node));
  if (static_cast<size_t>(id.node) >= tasks.size()) {
    return invalidArgument("SLURM_NODEID " + std::to_string(id.node) +
                           " is past SLURM_STEP_TASKS_PER_NODE '" + *per_node + "' (" +
                           std::to_string(tasks.size()) + " nodes)");
  }
  id.local_size = tasks[static_cast<size_t>(id.node)];
  auto job = get(env, "SLURM_JOB_ID");
  if (!job) job = get(env, "SLURM_JOBID");
  if (!job) return invalidArgument("SLURM_JOB_ID is not set, but SLURM_PROCID is");
  auto step = get(env, "SLURM_STEP_ID");
  if (!step) step = get(env, "SLURM_STEPID");
  id.slurm_job = *job;
  id.job_id = "slurm-" + *job + "." + step.value_or("0");
  RETURN_IF_ERROR(checkIdentity(id, "Slurm's SLURM_* variables"));
  return id;
}

}  // namespace

StatusOr<std::vector<std::string>> expandSlurmHostlist(std::string_view list) {
  std::vector<std::string> out;
  size_t pos = 0;
  int depth = 0;
  size_t start = 0;
  for (pos = 0; pos <= list.size(); ++pos) {
    char c = pos < list.size() ? list[pos] : ',';
    if (c == '[') {
      if (++depth > 1) return invalidArgument("host list '" + std::string(list) + "': nested '['");
    } else if (c == ']') {
      if (--depth < 0)
        return invalidArgument("host list '" + std::string(list) + "': ']' without '['");
    } else if ((c == ',' || c == ' ') && depth == 0) {
      std::string_view name = list.substr(start, pos - start);
      if (!name.empty()) RETURN_IF_ERROR(expandOne(name, list, out));
      start = pos + 1;
    }
  }
  if (depth != 0) return invalidArgument("host list '" + std::string(list) + "': '[' without ']'");
  if (out.empty()) return invalidArgument("host list '" + std::string(list) + "' names no host");
  return out;
}

StatusOr<std::vector<int>> expandSlurmTasksPerNode(std::string_view spec) {
  std::vector<int> out;
  const std::string what = "tasks per node '" + std::string(spec) + "'";
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string_view item =
        spec.substr(pos, comma == std::string_view::npos ? spec.npos : comma - pos);
    long count = 1;
    if (size_t paren = item.find('('); paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')') {
        return invalidArgument(what + ": expected N or N(xM), got '" + std::string(item) + "'");
      }
      ASSIGN_OR_RETURN(count, parseNumber(item.substr(paren + 2, item.size() - paren - 3), what));
      item = item.substr(0, paren);
    }
    ASSIGN_OR_RETURN(long n, parseNumber(item, what));
    if (n < 1 || n > (1 << 24) || count < 1 ||
        out.size() + static_cast<size_t>(count) > kMaxHosts) {
      return invalidArgument(what + ": counts must be positive (at most 1000000 nodes)");
    }
    out.insert(out.end(), static_cast<size_t>(count), static_cast<int>(n));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

StatusOr<std::optional<std::vector<AllocationNode>>> slurmAllocation(
    const std::map<std::string, std::string>& env) {
  if (!get(env, "SLURM_JOB_ID") && !get(env, "SLURM_JOBID"))
    return std::optional<std::vector<AllocationNode>>();
  auto list = get(env, "SLURM_JOB_NODELIST");
  if (!list) list = get(env, "SLURM_NODELIST");
  if (!list) return invalidArgument("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not");
  auto expanded = expandSlurmHostlist(*list);
  if (!expanded.isOk()) return expanded.status().withContext("SLURM_JOB_NODELIST");
  std::vector<std::string> hosts = std::move(expanded.value());
  std::vector<int> tasks(hosts.size(), 1);
  if (auto per_node = get(env, "SLURM_TASKS_PER_NODE")) {
    auto counts = expandSlurmTasksPerNode(*per_node);
    if (!counts.isOk()) return counts.status().withContext("SLURM_TASKS_PER_NODE");
    tasks = std::move(counts.value());
    if (tasks.size() != hosts.size()) {
      return invalidArgument("SLURM_TASKS_PER_NODE '" + *per_node + "' gives " +
                             std::to_string(tasks.size()) + " nodes but SLURM_JOB_NODELIST '" +
                             *list + "' names " + std::to_string(hosts.size()));
    }
  }
  std::vector<AllocationNode> nodes;
  for (size_t i = 0; i < hosts.size(); ++i) nodes.push_back({hosts[i], tasks[i]});
  return std::optional<std::vector<AllocationNode>>(std::move(nodes));
}

StatusOr<std::optional<LauncherIdentity>> launcherIdentity(
    const std::map<std::string, std::string>& env) {
  if (get(env, "OMPI_COMM_WORLD_RANK")) {
    ASSIGN_OR_RETURN(LauncherIdentity id, openMpiIdentity(env));
    return std::optional<LauncherIdentity>(std::move(id));
  }
  // A batch script's own process has SLURM_PROCID=0 but is no task of a
  // step (no SLURM_STEP_ID): it is not one of the job's ranks.
  if (get(env, "SLURM_PROCID") && (get(env, "SLURM_STEP_ID") || get(env, "SLURM_STEPID"))) {
    ASSIGN_OR_RETURN(LauncherIdentity id, slurmIdentity(env));
    return std::optional<LauncherIdentity>(std::move(id));
  }
  return std::optional<LauncherIdentity>();
}

}  // namespace kolo
