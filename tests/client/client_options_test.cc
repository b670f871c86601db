#include "client_options.h"

#include <gtest/gtest.h>

namespace kolo {
namespace {

using Env = std::map<std::string, std::string>;

Env jobEnv() {
  return {{"KOLO_JOB_ID", "j1"},   {"KOLO_JOB_TOKEN", "t"},    {"KOLO_SIZE", "8"},
          {"KOLO_LOCAL_RANK", "1"}, {"KOLO_LOCAL_SIZE", "4"}};
}

TEST(ClientOptions, DefaultsAndKoloVariables) {
  auto o = ClientOptions::fromEnv(jobEnv());
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->socket_path, "/run/kolo/agent.sock");
  EXPECT_EQ(o->job_id, "j1");
  EXPECT_EQ(o->token, "t");
  EXPECT_EQ(o->world_size, 8);
  EXPECT_EQ(o->local_rank, 1);
  EXPECT_EQ(o->local_size, 4);
  EXPECT_EQ(o->start_timeout, std::chrono::seconds(30));
  EXPECT_EQ(o->op_timeout, std::chrono::seconds(600));
  EXPECT_EQ(o->arena_bytes, 0u);

  Env e = jobEnv();
  e["KOLO_AGENT_SOCKET"] = "/tmp/x.sock";
  e["KOLO_START_TIMEOUT"] = "1.5";
  e["KOLO_OP_TIMEOUT"] = "2";
  e["KOLO_ARENA_MB"] = "64";
  o = ClientOptions::fromEnv(e);
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->socket_path, "/tmp/x.sock");
  EXPECT_EQ(o->start_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(o->op_timeout, std::chrono::seconds(2));
  EXPECT_EQ(o->arena_bytes, 64ull << 20);
}

TEST(ClientOptions, MissingJobVariablesNameTheVariableAndKolorun) {
  for (const char* var : {"KOLO_JOB_ID", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE"}) {
    Env e = jobEnv();
    e.erase(var);
    auto o = ClientOptions::fromEnv(e);
    ASSERT_FALSE(o.isOk()) << var;
    EXPECT_EQ(o.status().code(), Code::kInvalidArgument);
    EXPECT_NE(o.status().message().find(var), std::string::npos) << o.status().message();
    EXPECT_NE(o.status().message().find("kolorun"), std::string::npos) << o.status().message();
  }
}

TEST(ClientOptions, HorovodVariablesAreFallbacks) {
  Env e = {{"KOLO_JOB_ID", "j"}, {"HOROVOD_SIZE", "2"}, {"HOROVOD_LOCAL_RANK", "1"},
           {"HOROVOD_LOCAL_SIZE", "2"}};
  auto o = ClientOptions::fromEnv(e);
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->world_size, 2);
  EXPECT_EQ(o->local_rank, 1);
  e["KOLO_SIZE"] = "4";  // ours win
  o = ClientOptions::fromEnv(e);
  ASSERT_TRUE(o.isOk());
  EXPECT_EQ(o->world_size, 4);
}

TEST(ClientOptions, RejectsInconsistentValues) {
  struct Case {
    const char* var;
    const char* value;
    const char* expect;
  };
  for (const Case& c : {Case{"KOLO_LOCAL_RANK", "4", "KOLO_LOCAL_RANK"},
                        Case{"KOLO_LOCAL_SIZE", "9", "KOLO_LOCAL_SIZE"},
                        Case{"KOLO_SIZE", "0", "KOLO_SIZE"}, Case{"KOLO_SIZE", "eight", "integer"},
                        Case{"KOLO_START_TIMEOUT", "0", "KOLO_START_TIMEOUT"},
                        Case{"KOLO_OP_TIMEOUT", "-1", "KOLO_OP_TIMEOUT"},
                        Case{"KOLO_ARENA_MB", "-5", "KOLO_ARENA_MB"},
                        Case{"KOLO_DIRECT", "sometimes",
                             "KOLO_DIRECT must be auto, always (1) or off (0), got 'sometimes'"}}) {
    Env e = jobEnv();
    e[c.var] = c.value;
    auto o = ClientOptions::fromEnv(e);
    ASSERT_FALSE(o.isOk()) << c.var << "=" << c.value;
    EXPECT_EQ(o.status().code(), Code::kInvalidArgument);
    EXPECT_NE(o.status().message().find(c.expect), std::string::npos) << o.status().message();
  }
}

// KOLO_DIRECT: auto by default; always / off, with the old boolean
// spellings (1 was the default before auto) kept.
TEST(ClientOptions, DirectModes) {
  auto d = ClientOptions::fromEnv(jobEnv());
  ASSERT_TRUE(d.isOk()) << d.status().message();
  EXPECT_EQ(d->direct, ClientOptions::Direct::kAuto);
  const std::pair<const char*, ClientOptions::Direct> cases[] = {
      {"auto", ClientOptions::Direct::kAuto},     {"AUTO", ClientOptions::Direct::kAuto},
      {"always", ClientOptions::Direct::kAlways}, {"1", ClientOptions::Direct::kAlways},
      {"true", ClientOptions::Direct::kAlways},   {"off", ClientOptions::Direct::kOff},
      {"0", ClientOptions::Direct::kOff},         {"false", ClientOptions::Direct::kOff}};
  for (const auto& [value, want] : cases) {
    Env e = jobEnv();
    e["KOLO_DIRECT"] = value;
    auto o = ClientOptions::fromEnv(e);
    ASSERT_TRUE(o.isOk()) << value << ": " << o.status().message();
    EXPECT_EQ(o->direct, want) << value;
  }
}

TEST(ClientOptions, IgnoresTheDaemonsConfigFile) {
  Env e = jobEnv();
  e["KOLO_CONFIG"] = "/nonexistent/agent.conf";
  auto o = ClientOptions::fromEnv(e);
  EXPECT_TRUE(o.isOk()) << o.status().toString();
}

TEST(ClientOptions, EveryKnobIsDocumented) {
  Config c = ClientOptions::makeConfig();
  for (const char* k : {"agent-socket", "job-id", "job-token", "size", "local-rank", "local-size",
                        "start-timeout", "op-timeout", "arena-mb"}) {
    const Knob* knob = c.find(k);
    ASSERT_NE(knob, nullptr) << k;
    EXPECT_FALSE(knob->doc.empty()) << k;
  }
}

}  // namespace
}  // namespace kolo
