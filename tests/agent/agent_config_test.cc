#include "agent/agent_config.h"

#include <gtest/gtest.h>

#include <utility>

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

}  // namespace
}  // namespace kolo
