// kolorun's elastic options and the discovery script's output format.
#include <gtest/gtest.h>

#include "cli/elastic_runner.h"
#include "cli/kolorun_options.h"

namespace kolo::cli {
namespace {

StatusOr<KolorunOptions> parse(std::vector<std::string> args) { return parseKolorunArgs(args, {}); }

TEST(ElasticOptions, MinMaxDiscoveryTimeoutAndRestarts) {
  auto o = parse({"-np", "4", "--min-np", "2", "--max-np", "8", "--host-discovery-script", "./hosts.sh",
                  "--elastic-timeout", "30", "--max-restarts", "5", "python", "train.py"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_TRUE(o->elastic());
  EXPECT_EQ(o->min_np, 2);
  EXPECT_EQ(o->max_np, 8);
  EXPECT_EQ(o->host_discovery_script, "./hosts.sh");
  EXPECT_EQ(o->elastic_timeout_s, 30);
  EXPECT_EQ(o->max_restarts, 5);
  EXPECT_EQ(o->command, (std::vector<std::string>{"python", "train.py"}));

  // A discovery script alone makes the job elastic with --min-np = -np.
  o = parse({"-np", "3", "--host-discovery-script", "d.sh", "prog"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_TRUE(o->elastic());
  EXPECT_EQ(o->min_np, 3);
  EXPECT_EQ(o->max_restarts, 3);
  EXPECT_EQ(o->elastic_timeout_s, 600);

  o = parse({"-np", "3", "prog"});
  ASSERT_TRUE(o.isOk());
  EXPECT_FALSE(o->elastic());

  // Horovod's elastic mode on fixed hosts: -H with --min-np.
  o = parse({"-np", "2", "--min-np", "1", "-H", "a:1,b:1", "prog"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_TRUE(o->elastic());
  EXPECT_EQ(o->hosts, "a:1,b:1");
}

TEST(ElasticOptions, Errors) {
  auto expect = [](std::vector<std::string> args, const std::string& needle) {
    auto o = parse(args);
    ASSERT_FALSE(o.isOk()) << "accepted: " << args[0];
    EXPECT_NE(o.status().message().find(needle), std::string::npos) << o.status().message();
  };
  expect({"-np", "2", "--min-np", "3", "prog"}, "--min-np 3 is more than -np 2");
  expect({"-np", "4", "--min-np", "2", "--max-np", "3", "prog"}, "--max-np 3 is less than -np 4");
  expect({"-np", "4", "--max-np", "8", "prog"}, "--max-np needs an elastic job");
  expect(
      {"-np", "2", "--min-np", "1", "-H", "a:1,b:1", "--host-discovery-script", "./d.sh", "prog"},
      "either with --host-discovery-script or with -H/--hostfile (fixed hosts), not both");
  expect({"-np", "2", "--min-np", "0", "prog"}, "--min-np");
}

TEST(DiscoveryOutput, HostSlotsLinesCommentsAndErrors) {
  auto h = parseDiscoveryOutput("hostA:2\n\n# spare\nhostB\n  hostC:4  # big\n", "script");
  ASSERT_TRUE(h.isOk()) << h.status().toString();
  ASSERT_EQ(h->size(), 3u);
  EXPECT_EQ((*h)[0].host, "hostA");
  EXPECT_EQ((*h)[0].slots, 2);
  EXPECT_EQ((*h)[1].host, "hostB");
  EXPECT_EQ((*h)[1].slots, 1);
  EXPECT_EQ((*h)[2].host, "hostC");
  EXPECT_EQ((*h)[2].slots, 4);

  auto bad = parseDiscoveryOutput("hostA:2\nhostB:x\n", "script");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("script line 2: 'hostB:x' is not \"host:slots\""), std::string::npos)
      << bad.status().message();
  bad = parseDiscoveryOutput("a:1\na:2\n", "script");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(), "script lists host a twice");
  auto empty = parseDiscoveryOutput("", "script");
  ASSERT_TRUE(empty.isOk());
  EXPECT_TRUE(empty->empty());
}

}  // namespace
}  // namespace kolo::cli
