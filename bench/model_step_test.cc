// Unit tests of kolo-bench --model-step's pure parts: the model files, the
// gradient layout, the fusion label and the result row; and of the
// committed bench/models/*.txt against the published parameter counts.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "bench/bench_options.h"
#include "bench/model_step.h"

namespace kolo::bench {
namespace {

TEST(ModelFile, ParsesNamesCountsAndComments) {
  auto m = parseModel(
      "# a comment\n"
      "\n"
      "conv1.weight 9408  # 64x3x7x7\n"
      "  bn1.bias\t64\n",
      "tiny");
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ(m->name, "tiny");
  ASSERT_EQ(m->tensors.size(), 2u);
  EXPECT_EQ(m->tensors[0].name, "conv1.weight");
  EXPECT_EQ(m->tensors[0].count, 9408u);
  EXPECT_EQ(m->tensors[1].name, "bn1.bias");
  EXPECT_EQ(m->tensors[1].count, 64u);
  EXPECT_EQ(m->totalCount(), 9472u);
}

TEST(ModelFile, RejectsBadLines) {
  auto err = [](const std::string& text) {
    auto m = parseModel(text, "x");
    return m.isOk() ? std::string("ok") : m.status().message();
  };
  EXPECT_NE(err("a 1\nb\n").find("line 2"), std::string::npos);  // no count
  EXPECT_NE(err("a 1 2\n").find("expected 'name count'"), std::string::npos);
  EXPECT_NE(err("a -4\n").find("bad element count"), std::string::npos);
  EXPECT_NE(err("a 12x\n").find("bad element count"), std::string::npos);
  EXPECT_NE(err("a 0\n").find("no elements"), std::string::npos);
  EXPECT_NE(err("a 1\na 2\n").find("listed twice"), std::string::npos);
  EXPECT_NE(err("a 99999999999999999999999\n").find("bad element count"), std::string::npos);
  EXPECT_NE(err(std::string(201, 'n') + " 1\n").find("longer than"), std::string::npos);
  EXPECT_NE(err("# only a comment\n").find("no tensors"), std::string::npos);
  EXPECT_FALSE(loadModel("/nonexistent/model.txt").isOk());
}

TEST(ModelFile, LayoutAlignsEveryTensor) {
  auto m = parseModel("a 3\nb 1\nc 20\n", "x");
  ASSERT_TRUE(m.isOk());
  ModelLayout l = layoutModel(*m, 4);
  EXPECT_EQ(l.offsets, (std::vector<uint64_t>{0, 64, 128}));
  EXPECT_EQ(l.bytes, 128u + 80u);
  ModelLayout d = layoutModel(*m, 8);
  EXPECT_EQ(d.offsets, (std::vector<uint64_t>{0, 64, 128}));
  EXPECT_EQ(d.bytes, 128u + 160u);
  // The flat buffer (all elements, contiguous) fits in the layout.
  EXPECT_LE(m->totalCount() * 4, l.bytes);
}

TEST(ModelFile, FusionLabel) {
  EXPECT_EQ(fusionSetting(nullptr, nullptr, 2), "default");
  EXPECT_EQ(fusionSetting("0", nullptr, 2), "off");
  EXPECT_EQ(fusionSetting("64", nullptr, 2), "64M");
  EXPECT_EQ(fusionSetting(nullptr, "0", 2), "off");
  EXPECT_EQ(fusionSetting(nullptr, "67108864", 2), "64M");
  EXPECT_EQ(fusionSetting("32", "67108864", 2), "32M");  // KOLO_* wins
  EXPECT_EQ(fusionSetting("", nullptr, 4), "default");
  EXPECT_EQ(fusionSetting(nullptr, nullptr, 1), "default-1agent");
}

TEST(ModelStepTable, RowLinesUpWithTheHeaderAndTarget) {
  auto ends = [](const std::string& s) {
    std::vector<size_t> out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != ' ' && (i + 1 == s.size() || s[i + 1] == ' ')) out.push_back(i + 1);
    }
    return out;
  };
  std::string header = stepTableHeader();
  ASSERT_EQ(header[0], '#');
  std::vector<size_t> want = ends(header);
  StepRow r;
  r.model = "bert_large";
  r.tensors = 391;
  r.params = 335141888;
  r.bytes = 1340567552;
  r.fusion = "default";
  r.step_us = 1234567.8;
  r.algbw = 1.09;
  r.busbw = 1.63;
  r.flat_us = 1100000.0;
  r.flat_busbw = 1.83;
  r.wrong = 0;
  std::vector<size_t> got = ends(formatStepRow(r));
  // Header words: "#" "model" "tensors" "params" "size(B)" "fusion" "step(us)"
  // "algbw(GB/s)" "busbw(GB/s)" "flat(us)" "flat" "busbw" "step/flat" "#wrong".
  ASSERT_EQ(want.size(), 14u);
  want.erase(want.begin() + 10);  // "flat" of "flat busbw": the column ends after "busbw"
  want.erase(want.begin());       // the leading "#"
  EXPECT_EQ(got, want) << header << "\n" << formatStepRow(r);
  EXPECT_NEAR(r.ratio(), 1.1223, 1e-3);
  EXPECT_EQ(stepTargetLine(r), "# Target: step/flat 1.12 <= 1.25: met");
  r.step_us = 1650000.0;
  EXPECT_EQ(stepTargetLine(r), "# Target: step/flat 1.50 <= 1.25: MISSED by 20%");
  r.wrong.reset();
  EXPECT_NE(formatStepRow(r).find("N/A"), std::string::npos);
}

TEST(ModelStepOptions, ParsesModelStep) {
  auto o = parseBenchArgs({"--model-step", "bench/models/resnet50.txt", "-n", "5"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->model_step_path, "bench/models/resnet50.txt");
  EXPECT_EQ(o->iters, 5);
  EXPECT_TRUE(parseBenchArgs({}).value().model_step_path.empty());
}

TEST(ModelStepOptions, BlockingNeedsModelStep) {
  auto o = parseBenchArgs({"--model-step", "m.txt", "--blocking"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_TRUE(o->model_blocking);
  EXPECT_FALSE(parseBenchArgs({"--model-step", "m.txt"}).value().model_blocking);
  EXPECT_FALSE(parseBenchArgs({"--blocking"}).isOk());
}

// The committed lists match the published architectures' parameter counts.
TEST(ModelFiles, ResNet50) {
  auto m = loadModel(std::string(KOLO_BENCH_MODELS_DIR) + "/resnet50.txt");
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ(m->name, "resnet50");
  EXPECT_EQ(m->tensors.size(), 161u);
  EXPECT_EQ(m->totalCount(), 25557032u);
  EXPECT_EQ(m->tensors.front().name, "conv1.weight");
  EXPECT_EQ(m->tensors.front().count, 64u * 3 * 7 * 7);
  EXPECT_EQ(m->tensors.back().name, "fc.bias");
  EXPECT_EQ(m->tensors[m->tensors.size() - 2].count, 1000u * 2048);
}

TEST(ModelFiles, BertLarge) {
  auto m = loadModel(std::string(KOLO_BENCH_MODELS_DIR) + "/bert_large.txt");
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ(m->name, "bert_large");
  EXPECT_EQ(m->tensors.size(), 5u + 24u * 16u + 2u);
  EXPECT_EQ(m->totalCount(), 335141888u);
  EXPECT_EQ(m->tensors.front().name, "embeddings.word_embeddings.weight");
  EXPECT_EQ(m->tensors.front().count, 30522u * 1024);
  std::set<std::string> names;
  for (auto& t : m->tensors) names.insert(t.name);
  EXPECT_TRUE(names.count("encoder.layer.23.intermediate.dense.weight"));
  EXPECT_TRUE(names.count("pooler.dense.bias"));
}

TEST(ModelFiles, Vgg16) {
  auto m = loadModel(std::string(KOLO_BENCH_MODELS_DIR) + "/vgg16.txt");
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ(m->name, "vgg16");
  EXPECT_EQ(m->tensors.size(), 32u);
  EXPECT_EQ(m->totalCount(), 138357544u);
  EXPECT_EQ(m->tensors.front().name, "features.0.weight");
  EXPECT_EQ(m->tensors[26].name, "classifier.0.weight");
  EXPECT_EQ(m->tensors[26].count, 4096u * 512 * 7 * 7);
  EXPECT_EQ(m->tensors.back().name, "classifier.6.bias");
}

}  // namespace
}  // namespace kolo::bench
