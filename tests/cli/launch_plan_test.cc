// kolorun's launch plan: hosts, rank placement, per-rank environment and
// the ssh command line.
#include "cli/launch_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <regex>

namespace kolo::cli {
namespace {

std::map<std::string, std::string> asMap(const std::vector<std::pair<std::string, std::string>>& v) {
  return {v.begin(), v.end()};
}

TEST(HostList, ParsesHostsAndSlots) {
  auto h = parseHostList("h1:2, h2:4,h3");
  ASSERT_TRUE(h.isOk()) << h.status().toString();
  ASSERT_EQ(h->size(), 3u);
  EXPECT_EQ((*h)[0].host, "h1");
  EXPECT_EQ((*h)[0].slots, 2);
  EXPECT_EQ((*h)[1].host, "h2");
  EXPECT_EQ((*h)[1].slots, 4);
  EXPECT_EQ((*h)[2].host, "h3");
  EXPECT_EQ((*h)[2].slots, 1);
}

TEST(HostList, RejectsBadEntries) {
  for (const char* bad : {"", "h1:0", "h1:x", "h1:2,,h2", ":2", "h1:-1", "h1:2x"}) {
    auto h = parseHostList(bad);
    EXPECT_FALSE(h.isOk()) << "'" << bad << "' was accepted";
    if (!h.isOk()) {
      EXPECT_EQ(h.status().code(), Code::kInvalidArgument);
    }
  }
}

TEST(Hostfile, ParsesSlotsCommentsAndBlankLines) {
  auto h = parseHostfile("# cluster\nnode-a slots=4\n\n  node-b   slots = 2  # half\nnode-c\n", "hosts.txt");
  ASSERT_TRUE(h.isOk()) << h.status().toString();
  ASSERT_EQ(h->size(), 3u);
  EXPECT_EQ((*h)[0].host, "node-a");
  EXPECT_EQ((*h)[0].slots, 4);
  EXPECT_EQ((*h)[1].host, "node-b");
  EXPECT_EQ((*h)[1].slots, 2);
  EXPECT_EQ((*h)[2].slots, 1);
}

TEST(Hostfile, ErrorsNameTheFileAndLine) {
  auto h = parseHostfile("a slots=2\nb cpus=3\n", "hosts.txt");
  ASSERT_FALSE(h.isOk());
  EXPECT_NE(h.status().message().find("hosts.txt:2"), std::string::npos) << h.status().message();
  auto empty = parseHostfile("# nothing\n", "hosts.txt");
  ASSERT_FALSE(empty.isOk());
  EXPECT_NE(empty.status().message().find("no hosts"), std::string::npos);
  EXPECT_FALSE(parseHostfile("a slots=0\n", "f").isOk());
}

TEST(Placement, EvenBlocksPutLargerBlocksFirst) {
  EXPECT_EQ(evenBlocks(5, 2), (std::vector<int>{3, 2}));
  EXPECT_EQ(evenBlocks(7, 3), (std::vector<int>{3, 2, 2}));
  EXPECT_EQ(evenBlocks(4, 4), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(evenBlocks(3, 1), (std::vector<int>{3}));
}

TEST(Placement, FillSlotsInHostOrder) {
  auto a = fillSlots(3, {2, 2});
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(*a, (std::vector<int>{2, 1}));
  auto b = fillSlots(4, {2, 2, 2});
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(*b, (std::vector<int>{2, 2}));  // the third host is not used
  auto c = fillSlots(5, {2, 2});
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("more than the 4 slots"), std::string::npos) << c.status().message();
}

TEST(Placement, LocalAndCrossRanks) {
  auto p = placeRanks({3, 2});
  ASSERT_EQ(p.size(), 5u);
  // rank: node, local_rank, local_size, cross_rank, cross_size
  const int want[5][5] = {{0, 0, 3, 0, 2}, {0, 1, 3, 0, 2}, {0, 2, 3, 0, 1}, {1, 0, 2, 1, 2}, {1, 1, 2, 1, 2}};
  for (int r = 0; r < 5; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(p[r].rank, r);
    EXPECT_EQ(p[r].node, want[r][0]);
    EXPECT_EQ(p[r].local_rank, want[r][1]);
    EXPECT_EQ(p[r].local_size, want[r][2]);
    EXPECT_EQ(p[r].cross_rank, want[r][3]);
    EXPECT_EQ(p[r].cross_size, want[r][4]);
  }
  // A small node first: local rank 1 exists only on the second node.
  auto q = placeRanks({1, 3});
  EXPECT_EQ(q[2].local_rank, 1);
  EXPECT_EQ(q[2].cross_rank, 0);
  EXPECT_EQ(q[2].cross_size, 1);
  EXPECT_EQ(q[1].cross_rank, 1);
  EXPECT_EQ(q[1].cross_size, 2);
}

LaunchPlan twoNodePlan(bool remote) {
  LaunchPlan plan;
  plan.job = {"job-0123456789ab", "0123456789abcdef0123456789abcdef"};
  plan.nodes = {{"localhost", true, "node0", "/tmp/k/agent-0.sock", "127.0.0.1:5000"},
                {remote ? "h2" : "localhost", !remote, remote ? "" : "node1", "/tmp/k/agent-1.sock",
                 remote ? "" : "127.0.0.1:5001"}};
  plan.ranks = placeRanks({2, 1});
  plan.coordinator = "127.0.0.1:4000";
  plan.start_timeout_s = 45;
  plan.extra_env = {{"KOLO_FUSION_THRESHOLD_MB", "32"}};
  plan.command = {"python", "train.py", "--lr", "0.1 x", "it's"};
  return plan;
}

TEST(RankEnv, HasEveryVariable) {
  LaunchPlan plan = twoNodePlan(false);
  auto env = asMap(rankEnv(plan, 2));
  EXPECT_EQ(env["KOLO_AGENT_SOCKET"], "/tmp/k/agent-1.sock");
  EXPECT_EQ(env["KOLO_AGENT_RPC"], "127.0.0.1:5001");
  EXPECT_EQ(env["KOLO_COORDINATOR"], "127.0.0.1:4000");
  EXPECT_EQ(env["KOLO_JOB_ID"], "job-0123456789ab");
  EXPECT_EQ(env["KOLO_JOB_TOKEN"], "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(env["KOLO_START_TIMEOUT"], "45");
  EXPECT_EQ(env["KOLO_FUSION_THRESHOLD_MB"], "32");
  for (const char* prefix : {"KOLO_", "HOROVOD_"}) {
    std::string p = prefix;
    EXPECT_EQ(env[p + "RANK"], "2");
    EXPECT_EQ(env[p + "SIZE"], "3");
    EXPECT_EQ(env[p + "LOCAL_RANK"], "0");
    EXPECT_EQ(env[p + "LOCAL_SIZE"], "1");
    EXPECT_EQ(env[p + "CROSS_RANK"], "1");
    EXPECT_EQ(env[p + "CROSS_SIZE"], "2");
  }
}

TEST(RankEnv, LeavesOutUnknownAddresses) {
  LaunchPlan plan = twoNodePlan(true);
  plan.coordinator.clear();
  auto env = asMap(rankEnv(plan, 2));
  EXPECT_EQ(env.count("KOLO_AGENT_RPC"), 0u);
  EXPECT_EQ(env.count("KOLO_COORDINATOR"), 0u);
  EXPECT_EQ(env["KOLO_AGENT_SOCKET"], "/tmp/k/agent-1.sock");
}

TEST(RankArgv, LocalRanksRunTheCommandItself) {
  LaunchPlan plan = twoNodePlan(true);
  EXPECT_EQ(rankArgv(plan, 0), plan.command);
}

TEST(RankArgv, RemoteRanksGoThroughSshWithTheirEnvironmentButNoSecret) {
  LaunchPlan plan = twoNodePlan(true);
  plan.extra_env["MY_API_TOKEN"] = "extra-secret-value";
  auto argv = rankArgv(plan, 2);
  ASSERT_EQ(argv.size(), 7u);
  EXPECT_EQ(std::vector<std::string>(argv.begin(), argv.begin() + 6),
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "h2", "sh", "-c"}));
  // The remote shell script: reads the secrets from stdin, then runs the
  // command under every other variable.
  const std::string& script = argv[6];
  EXPECT_EQ(
      script.rfind(
          "'while IFS= read -r kolo_kv; do export \"$kolo_kv\"; done; unset kolo_kv; exec env ", 0),
      0u)
      << script;
  EXPECT_NE(script.find("KOLO_RANK=2"), std::string::npos) << script;
  EXPECT_NE(script.find("KOLO_JOB_ID=job-0123456789ab"), std::string::npos) << script;
  EXPECT_NE(script.find("python train.py --lr"), std::string::npos) << script;
  // No secret anywhere on the command line `ps` shows.
  for (const std::string& word : argv) {
    EXPECT_EQ(word.find(plan.job.token), std::string::npos) << word;
    EXPECT_EQ(word.find("KOLO_JOB_TOKEN"), std::string::npos) << word;
    EXPECT_EQ(word.find("extra-secret-value"), std::string::npos) << word;
  }
  EXPECT_EQ(rankStdin(plan, 2),
            "KOLO_JOB_TOKEN=" + plan.job.token + "\nMY_API_TOKEN=extra-secret-value\n");
  EXPECT_EQ(rankStdin(plan, 0), "") << "a local rank gets its token in its environment";
}

// What ssh does on the remote host with argv: join the words from
// argv[first] on with spaces and hand them to a shell (sh) whose stdin is
// `stdin_path`. Returns the output; *status is pclose's.
std::string runAsRemoteShell(const std::vector<std::string>& argv, size_t first,
                             const std::string& stdin_path, int* status) {
  std::string remote;
  for (size_t i = first; i < argv.size(); ++i) remote += (remote.empty() ? "" : " ") + argv[i];
  const std::string cmd = "sh -c " + shellQuote(remote) + " < " + stdin_path;
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return out;
  }
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

TEST(RankArgv, TheRemoteShellGetsTheSecretsAndEveryWordIntact) {
  // What ssh does on the remote host: join the words after the host with
  // spaces and hand them to the login shell, here sh, with our stdin.
  LaunchPlan plan = twoNodePlan(true);
  plan.command = {
      "sh",
      "-c",
      "printf '[%s] [%s] [%s] [%s]\\n' \"$KOLO_JOB_TOKEN\" \"$KOLO_RANK\" \"$1\" \"$2\"",
      "arg0",
      "it's a $word",
      "x  y"};
  char tmpl[] = "/tmp/kolo-ssh-stdin-XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const std::string in = rankStdin(plan, 2);
  ASSERT_EQ(::write(fd, in.data(), in.size()), static_cast<ssize_t>(in.size()));
  ::close(fd);
  int status = -1;
  std::string out = runAsRemoteShell(rankArgv(plan, 2), 4, tmpl, &status);
  EXPECT_EQ(status, 0);
  ::unlink(tmpl);
  EXPECT_EQ(out, "[" + plan.job.token + "] [2] [it's a $word] [x  y]\n");
}

TEST(RankEnv, UserVariablesComeLastAndReplaceTheSameName) {
  LaunchPlan plan = twoNodePlan(false);
  plan.user_env = {{"KOLO_FUSION_THRESHOLD_MB", "8"}, {"MY_VAR", "a b"}};
  auto list = rankEnv(plan, 0);
  auto env = asMap(list);
  EXPECT_EQ(env["KOLO_FUSION_THRESHOLD_MB"], "8");
  EXPECT_EQ(env["MY_VAR"], "a b");
  size_t n = 0;
  for (auto& kv : list) n += kv.first == "KOLO_FUSION_THRESHOLD_MB";
  EXPECT_EQ(n, 1u) << "one entry per name";
}

TEST(RankArgv, RemoteRanksGetSshOptionsTheWorkingDirectoryAndUserVariables) {
  LaunchPlan plan = twoNodePlan(true);
  plan.ssh_options = {"-p", "2222", "-i", "/keys/id"};
  plan.wdir = "/data/my run";
  plan.user_env = {{"MY_VAR", "v"}};
  auto argv = rankArgv(plan, 2);
  ASSERT_EQ(argv.size(), 11u);
  EXPECT_EQ(std::vector<std::string>(argv.begin(), argv.begin() + 10),
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "-p", "2222", "-i", "/keys/id", "h2",
                                      "sh", "-c"}));
  EXPECT_NE(argv[10].find("cd '\\''/data/my run'\\'' || exit 127; exec env "), std::string::npos)
      << argv[10];
  EXPECT_NE(argv[10].find("MY_VAR=v"), std::string::npos) << argv[10];
  // Run what the remote shell runs (as in the test above): the command
  // starts in the working directory with the variable set.
  char dir[] = "/tmp/kolo-wdir-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  plan.wdir = dir;
  plan.command = {"sh", "-c", "echo \"$(pwd) $MY_VAR\""};
  int status = -1;
  std::string out = runAsRemoteShell(rankArgv(plan, 2), 8, "/dev/null", &status);
  EXPECT_EQ(status, 0);
  ::rmdir(dir);
  EXPECT_EQ(out, std::string(dir) + " v\n");
}

TEST(ShellQuote, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shellQuote("abc-1.2/x=y:z"), "abc-1.2/x=y:z");
  EXPECT_EQ(shellQuote("a b"), "'a b'");
  EXPECT_EQ(shellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(shellQuote(""), "''");
  EXPECT_EQ(shellQuote("$HOME;rm"), "'$HOME;rm'");
}

TEST(JobIdentity, RandomHexIdAndToken) {
  auto a = newJobIdentity();
  auto b = newJobIdentity();
  ASSERT_TRUE(a.isOk());
  ASSERT_TRUE(b.isOk());
  EXPECT_TRUE(std::regex_match(a->job_id, std::regex("job-[0-9a-f]{12}"))) << a->job_id;
  EXPECT_TRUE(std::regex_match(a->token, std::regex("[0-9a-f]{32}"))) << a->token;
  EXPECT_NE(a->job_id, b->job_id);
  EXPECT_NE(a->token, b->token);
}

TEST(EmbeddedAgentId, PaddedSoThatTheySortInRankOrder) {
  EXPECT_EQ(embeddedAgentId(0, 1), "node0");
  EXPECT_EQ(embeddedAgentId(3, 4), "node3");
  EXPECT_EQ(embeddedAgentId(9, 10), "node9");
  EXPECT_EQ(embeddedAgentId(3, 11), "node03");
  EXPECT_EQ(embeddedAgentId(10, 11), "node10");
  EXPECT_LT(embeddedAgentId(2, 12), embeddedAgentId(10, 12));
}

TEST(LocalHost, RecognisesThisMachine) {
  EXPECT_TRUE(isLocalHost("localhost"));
  EXPECT_TRUE(isLocalHost("127.0.0.1"));
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  EXPECT_TRUE(isLocalHost(name));
  EXPECT_FALSE(isLocalHost("no-such-host.invalid"));
}

}  // namespace
}  // namespace kolo::cli
