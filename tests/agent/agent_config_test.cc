#include "agent/agent_config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kolo {
namespace {

TEST(AgentConfig, PathTokensAreReplacedWithFileSafeText) {
  EXPECT_EQ(substitutePathToken("/tmp/trace-%a.json", "%a", "node0"), "/tmp/trace-node0.json");
  EXPECT_EQ(substitutePathToken("/t/%a/%a.json", "%a", "host:123"), "/t/host_123/host_123.json");
  EXPECT_EQ(substitutePathToken("/t/tune-%j.csv", "%j", "job/7 x"), "/t/tune-job_7_x.csv");
  EXPECT_EQ(substitutePathToken("/t/plain.json", "%a", "node0"), "/t/plain.json");
  // A value containing the token itself does not loop.
  EXPECT_EQ(substitutePathToken("%a-%a", "%a", "%a"), "_a-_a");
}

TEST(AgentConfig, FusionAndAutotuneKnobsAreCheckedAndParsed) {
  Config c("kolo-agent");
  defineAgentKnobs(c);
  const char* argv[] = {"kolo-agent", "--fusion-chunk-mb=2", "--fusion-max-tensor-kb=512", "--autotune",
                        "--autotune-log-file=/tmp/t-%a-%j.csv", "--agent-id=n1", "--cross-inline-bytes=64"};
  ASSERT_TRUE(c.loadWithEnv(7, argv, {}).isOk());
  auto o = agentOptionsFrom(c);
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o.value().fusion_chunk_bytes, 2u << 20);
  EXPECT_EQ(o.value().fusion_max_tensor_bytes, 512u << 10);
  EXPECT_EQ(o.value().cross_inline_bytes, 64u);
  EXPECT_TRUE(o.value().autotune);
  EXPECT_EQ(o.value().autotune_log_file, "/tmp/t-n1-%j.csv");  // %j is per job, later
  EXPECT_FALSE(o.value().autotune_fixed_fusion);

  // Defaults: tensors of 1 MiB and up cross agents unfused; cached
  // allreduces up to 256 bytes ride in the negotiation message.
  {
    Config d("kolo-agent");
    defineAgentKnobs(d);
    const char* argv0[] = {"kolo-agent"};
    ASSERT_TRUE(d.loadWithEnv(1, argv0, {}).isOk());
    auto od = agentOptionsFrom(d);
    ASSERT_TRUE(od.isOk()) << od.status().toString();
    EXPECT_EQ(od.value().fusion_max_tensor_bytes, 1024u << 10);
    EXPECT_EQ(od.value().cross_inline_bytes, 256u);
    EXPECT_EQ(od.value().cross_pipeline_bytes, 8u << 20);
  }

  for (auto [flag, text] : {std::pair<const char*, const char*>{"--autotune-steps-per-sample=0",
                                                                  "--autotune-steps-per-sample must be >= 1"},
                             {"--fusion-chunk-mb=-1", "--fusion-chunk-mb must be >= 0"},
                             {"--fusion-max-tensor-kb=-5", "--fusion-max-tensor-kb must be >= 0"},
                             {"--cross-inline-bytes=-1", "--cross-inline-bytes must be between 0 and 1048576"},
                             {"--cross-inline-bytes=1048577", "--cross-inline-bytes must be between 0 and 1048576"},
                             {"--ucx-tcp-tx-seg-bytes=4194304",
                              "ucx-tcp-rx-seg-bytes (1048576) must be at least ucx-tcp-tx-seg-bytes (4194304)"},
                             {"--backend-chunk-bytes=8", "backend chunk-bytes must be >= 64"},
                             {"--cross-pipeline-kb=-1", "--cross-pipeline-kb must be >= 0"},
                             {"--backend-reduce-thread=sometimes",
                              "backend-reduce-thread must be auto, true or false, got 'sometimes'"}}) {
    Config bad("kolo-agent");
    defineAgentKnobs(bad);
    const char* argv2[] = {"kolo-agent", flag};
    ASSERT_TRUE(bad.loadWithEnv(2, argv2, {}).isOk()) << flag;
    auto e = agentOptionsFrom(bad);
    ASSERT_FALSE(e.isOk()) << flag;
    EXPECT_NE(e.status().message().find(text), std::string::npos) << e.status().message();
  }
}

TEST(AgentConfig, SocketLimitsHaveDefaultsTakeTheEnvironmentAndNameTheKnobWhenBad) {
  {
    Config c("kolo-agent");
    defineAgentKnobs(c);
    const char* argv[] = {"kolo-agent"};
    ASSERT_TRUE(c.loadWithEnv(1, argv, {}).isOk());
    auto o = agentOptionsFrom(c);
    ASSERT_TRUE(o.isOk()) << o.status().toString();
    const AgentLimits& l = o.value().limits;
    EXPECT_EQ(l.max_local_size, 256);
    EXPECT_EQ(l.max_arena_bytes, 64ull << 30);
    EXPECT_EQ(l.max_names_in_flight, 4096);
    EXPECT_EQ(l.max_bytes_in_flight, 0u);
    EXPECT_EQ(l.max_connections, 1024);
    EXPECT_EQ(l.max_connections_per_uid, 256);
    EXPECT_DOUBLE_EQ(l.handshake_timeout_s, 10);
    EXPECT_EQ(l.status_max_in_flight, 100);
  }
  {
    Config c("kolo-agent");
    defineAgentKnobs(c);
    const char* argv[] = {"kolo-agent", "--max-names-in-flight=64"};
    ASSERT_TRUE(c.loadWithEnv(2, argv,
                              {{"KOLO_MAX_NAMES_IN_FLIGHT", "8"},
                               {"KOLO_HANDSHAKE_TIMEOUT_S", "0.5"},
                               {"KOLO_MAX_CONNECTIONS_PER_UID", "7"}})
                    .isOk());
    auto o = agentOptionsFrom(c);
    ASSERT_TRUE(o.isOk()) << o.status().toString();
    EXPECT_EQ(o.value().limits.max_names_in_flight, 64);  // the flag wins
    EXPECT_DOUBLE_EQ(o.value().limits.handshake_timeout_s, 0.5);
    EXPECT_EQ(o.value().limits.max_connections_per_uid, 7);
  }
  auto bad = [](const char* flag) {
    Config c("kolo-agent");
    defineAgentKnobs(c);
    const char* argv[] = {"kolo-agent", flag};
    EXPECT_TRUE(c.loadWithEnv(2, argv, {}).isOk());
    return agentOptionsFrom(c).status().message();
  };
  EXPECT_EQ(bad("--max-local-size=0"), "--max-local-size must be between 1 and 65536 (got 0)");
  EXPECT_EQ(bad("--max-connections=-1"),
            "--max-connections must be between 1 and 1048576 (got -1)");
  EXPECT_EQ(bad("--handshake-timeout-s=0"), "--handshake-timeout-s must be > 0 and at most 3600");
  EXPECT_EQ(bad("--max-arena-mb=512"), "--arena-mb 1024 is larger than --max-arena-mb 512");
}

TEST(AgentConfig, DeviceCrossIsAutoByDefaultTakesTheEnvironmentAndRefusesOtherValues) {
  auto load = [](std::vector<const char*> argv,
                 std::map<std::string, std::string> env) -> StatusOr<AgentOptions> {
    Config c("kolo-agent");
    defineAgentKnobs(c);
    RETURN_IF_ERROR(c.loadWithEnv(static_cast<int>(argv.size()), argv.data(), env));
    return agentOptionsFrom(c);
  };
  auto d = load({"kolo-agent"}, {});
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  EXPECT_EQ(d->device_cross, gpu::DeviceCrossMode::kAuto);
  auto e = load({"kolo-agent"}, {{"KOLO_DEVICE_CROSS", "staged"}});
  ASSERT_TRUE(e.isOk()) << e.status().toString();
  EXPECT_EQ(e->device_cross, gpu::DeviceCrossMode::kStaged);
  auto f = load({"kolo-agent", "--device-cross=nccl"}, {{"KOLO_DEVICE_CROSS", "staged"}});
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  EXPECT_EQ(f->device_cross, gpu::DeviceCrossMode::kNccl);
  auto bad = load({"kolo-agent", "--device-cross=gpu"}, {});
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(), "--device-cross must be auto, nccl or staged (got 'gpu')");
}

}  // namespace
}  // namespace kolo
