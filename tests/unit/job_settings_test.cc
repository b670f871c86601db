// Per-job tuning from a trainer's environment (common/job_settings.h).
#include "common/job_settings.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kolo {
namespace {

TEST(JobSettings, HorovodUnitsAndKoloVariablesFirst) {
  auto s = parseJobSettings({{"HOROVOD_FUSION_THRESHOLD", "65536"},
                             {"HOROVOD_CACHE_CAPACITY", "0"},
                             {"HOROVOD_AUTOTUNE", "1"},
                             {"HOROVOD_CYCLE_TIME", "3.5"},
                             {"UNRELATED", "x"}});
  ASSERT_TRUE(s.isOk()) << s.status().toString();
  EXPECT_EQ(s->fusion_threshold_bytes, 65536u) << "bytes, exact (not rounded to MiB)";
  EXPECT_EQ(s->cache_capacity, 0);
  EXPECT_EQ(s->autotune, true);
  EXPECT_EQ(s->cycle_time_ms, 3.5);
  EXPECT_EQ(s->describe(),
            "fusion threshold 65536 bytes, cache capacity 0, autotune on, cycle time 3.500000 ms (no effect)");
  auto k = parseJobSettings({{"KOLO_FUSION_THRESHOLD_MB", "2"}, {"HOROVOD_FUSION_THRESHOLD", "1"},
                             {"KOLO_AUTOTUNE", "off"}});
  ASSERT_TRUE(k.isOk());
  EXPECT_EQ(k->fusion_threshold_bytes, 2u << 20) << "KOLO_* wins, in MiB";
  EXPECT_EQ(k->autotune, false);
  EXPECT_FALSE(k->cache_capacity.has_value());
  auto none = parseJobSettings({{"HOROVOD_FUSION_THRESHOLD", ""}});
  ASSERT_TRUE(none.isOk());
  EXPECT_TRUE(none->empty()) << "an empty variable is unset";
  EXPECT_EQ(none->describe(), "none");
}

TEST(JobSettings, BadValuesNameTheVariable) {
  struct Case {
    const char* name;
    const char* value;
    const char* message;
  };
  const Case cases[] = {
      {"HOROVOD_FUSION_THRESHOLD", "64MB",
       "HOROVOD_FUSION_THRESHOLD=64MB in the trainer's environment: expected an integer from 0 to 1073741824"},
      {"HOROVOD_FUSION_THRESHOLD", "2147483648", "expected an integer from 0 to 1073741824"},
      {"KOLO_FUSION_THRESHOLD_MB", "2048", "KOLO_FUSION_THRESHOLD_MB=2048 in the trainer's environment: "
                                           "expected an integer from 0 to 1024"},
      {"HOROVOD_CACHE_CAPACITY", "-1", "expected an integer from 0 to 1048576"},
      {"HOROVOD_AUTOTUNE", "maybe", "HOROVOD_AUTOTUNE=maybe in the trainer's environment: expected 1 or 0"},
      {"HOROVOD_CYCLE_TIME", "fast", "expected milliseconds"},
  };
  for (const Case& c : cases) {
    auto s = parseJobSettings({{c.name, c.value}});
    ASSERT_FALSE(s.isOk()) << c.name << "=" << c.value;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
    EXPECT_NE(s.status().message().find(c.message), std::string::npos) << s.status().message();
  }
}

TEST(JobSettings, EveryVariableIsForwarded) {
  const auto& names = jobSettingVariables();
  for (const char* n : {"KOLO_FUSION_THRESHOLD_MB", "HOROVOD_FUSION_THRESHOLD", "KOLO_CACHE_CAPACITY",
                        "HOROVOD_CACHE_CAPACITY", "KOLO_AUTOTUNE", "HOROVOD_AUTOTUNE", "KOLO_CYCLE_TIME_MS",
                        "HOROVOD_CYCLE_TIME"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
}

}  // namespace
}  // namespace kolo
