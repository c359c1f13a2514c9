// Tests for train/epoch_figures.def, the table of an epoch's figures: every writer and reader
// covers every row as its row says (the metrics file's JSON Lines and CSV, TensorBoard's scalars,
// a checkpoint's run state written and read back), each with a value no other row shares.
// Not here: each writer's exact text (test_metrics.cpp, test_tensorboard.cpp,
// tests/train/test_checkpoint.cpp); read_checkpoint.py's reading of the table
// (tests/integration/test_read_checkpoint.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dptrain/core/safetensors.h"
#include "dptrain/report/metrics.h"
#include "dptrain/report/tensorboard.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/epoch_stats.h"

namespace dptrain {
namespace {

constexpr size_t kRows = sizeof kEpochFigures / sizeof kEpochFigures[0];

// Row `index`'s value, unlike every other row's and in the range a checkpoint's checks allow
// (epoch 1 of 2, fractions below 1, whole bytes, at most 21 steps of an epoch of 625).
void distinct(int64_t& value, size_t index) { value = static_cast<int64_t>(index) + 1; }
void distinct(double& value, size_t index) {
  const bool bytes = std::strcmp(kEpochFigures[index].unit, "bytes") == 0;
  value = bytes ? 1024.0 * static_cast<double>(index + 1) : static_cast<double>(index + 1) / 64;
}
void distinct(std::string& value, size_t index) { value = "text" + std::to_string(index); }

// A record whose every row holds its distinct value (derived rows too: set after the stats).
EpochRecord distinct_record() {
  EpochRecord record;
  size_t index = 0;
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  distinct(record.name, index++);
#include "dptrain/train/epoch_figures.def"
#undef DPTRAIN_EPOCH_FIGURE
  return record;
}

// A value as the metrics file writes it (no row's distinct value needs quoting).
std::string metrics_text(int64_t value) { return std::to_string(value); }
std::string metrics_text(double value) {  // every distinct value is exact in 15 digits
  char text[64];
  std::snprintf(text, sizeof text, "%.15g", value);
  return text;
}
std::string metrics_text(const std::string& value) { return value; }

// A value as TensorBoard's scalar holds it (no text row is written there).
double scalar(double value) { return value; }
double scalar(int64_t value) { return static_cast<double>(value); }
double scalar(const std::string&) { return std::nan(""); }

// The same value, NaN for NaN.
bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }
bool same(int64_t a, int64_t b) { return a == b; }

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> pieces(1);
  for (char c : text) {
    if (c == separator) {
      pieces.emplace_back();
    } else {
      pieces.back() += c;
    }
  }
  return pieces;
}

TEST(EpochFigures, EveryRowIsNamedOnceWithItsKnownColumns) {
  for (size_t i = 0; i < kRows; ++i) {
    const EpochFigure& f = kEpochFigures[i];
    SCOPED_TRACE(f.name);
    for (size_t j = 0; j < i; ++j) EXPECT_STRNE(f.name, kEpochFigures[j].name);
    const std::string of = f.of, type = f.type;
    EXPECT_TRUE(of == "stats" || of == "derived" || of == "run");
    EXPECT_TRUE(type == "int64_t" || type == "double" || type == "std::string");
    // A checkpoint keeps an epoch's stats only: what the report adds it never reads back.
    if (f.kept != EpochFigureKept::not_kept) {
      EXPECT_EQ(of, "stats");
    }
  }
}

// The metrics file: one column (CSV) and one key (JSON Lines) per row written there, in the
// table's order, holding the row's value; no other row.
TEST(EpochFigures, MetricsFileHoldsEveryRowItSays) {
  const EpochRecord record = distinct_record();
  std::vector<std::string> names, values;
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  if (writes_metrics(EpochFigureWritten::written)) {                       \
    names.push_back(#name);                                                \
    values.push_back(metrics_text(record.name));                           \
  }
#include "dptrain/train/epoch_figures.def"
#undef DPTRAIN_EPOCH_FIGURE
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(split(metrics_csv_header(), ','), names);
  std::string csv = format_metrics_record(record, MetricsFormat::kCsv);
  ASSERT_EQ(csv.back(), '\n');
  EXPECT_EQ(split(csv.substr(0, csv.size() - 1), ','), values);

  std::string json = format_metrics_record(record, MetricsFormat::kJsonLines);
  ASSERT_EQ(json.substr(0, 2), "{\"");
  ASSERT_EQ(json.substr(json.size() - 2), "}\n");
  const std::vector<std::string> pairs = split(json.substr(1, json.size() - 3), ',');
  ASSERT_EQ(pairs.size(), names.size()) << json;
  for (size_t i = 0; i < names.size(); ++i) {
    const bool text = values[i].rfind("text", 0) == 0;
    EXPECT_EQ(pairs[i], "\"" + names[i] + "\":" + (text ? "\"" + values[i] + "\"" : values[i]));
  }
}

// TensorBoard: one scalar "epoch/<name>" per row written there, in the table's order, holding the
// row's value (float32 in the file); no other row.
TEST(EpochFigures, TensorBoardLogsEveryRowItSays) {
  const EpochRecord distinct_values = distinct_record();
  const EpochStats& stats = distinct_values;
  const EpochRecord record(stats);  // the derived rows as the stats give them
  std::vector<TensorBoardScalar> expected;
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  if (writes_tensorboard(EpochFigureWritten::written)) {                   \
    expected.push_back({"epoch/" #name, scalar(record.name)});             \
  }
#include "dptrain/train/epoch_figures.def"
#undef DPTRAIN_EPOCH_FIGURE
  const std::vector<TensorBoardScalar> scalars = epoch_scalars(stats);
  ASSERT_EQ(scalars.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(scalars[i].tag, expected[i].tag);
    EXPECT_EQ(scalars[i].value, expected[i].value) << expected[i].tag;
    EXPECT_TRUE(std::isfinite(scalars[i].value)) << expected[i].tag;
  }
}

// A checkpoint's run state: every row kept there is written under its name and read back
// exactly; every other row is not written, and reads back as its initial value.
TEST(EpochFigures, RunStateKeepsEveryRowItSays) {
  Checkpoint c;
  c.config = CheckpointConfig{4, 10, 1, 96, 0.1, 7, 60000, 1, std::string(64, 'd'), Recipe{}, 0};
  c.epochs_done = 1;
  c.global_step = 625;
  c.history = {distinct_record()};
  c.tensors.emplace_back("w", torch::tensor({1.5f}));
  const std::vector<uint8_t> bytes = serialize_checkpoint(c);

  const std::string state =
      parse_safetensors(bytes, "figures").first.metadata.at("dptrain.run_state");
  const size_t history = state.find("\"history\":[");
  ASSERT_NE(history, std::string::npos) << state;
  const std::string epoch = state.substr(history);
  const Checkpoint read = parse_checkpoint(bytes, "figures");
  ASSERT_EQ(read.history.size(), 1u);
  const EpochStats& saved = c.history[0];
  const EpochStats& back = read.history[0];
  const EpochStats fresh;
  // Row by row: `kept` says whether the run state names it and which value it reads back.
#define DPTRAIN_EPOCH_FIGURE(name, of, type, initial, unit, kept, written) \
  DPTRAIN_TEST_RUN_STATE_##of(name, kept);
#define DPTRAIN_TEST_RUN_STATE_stats(name, kept_in)                              \
  {                                                                              \
    SCOPED_TRACE(#name);                                                         \
    const bool kept = EpochFigureKept::kept_in != EpochFigureKept::not_kept;     \
    EXPECT_EQ(epoch.find("\"" #name "\":") != std::string::npos, kept) << epoch; \
    EXPECT_TRUE(same(back.name, kept ? saved.name : fresh.name));                \
  }
#define DPTRAIN_TEST_RUN_STATE_derived(name, kept_in) \
  EXPECT_EQ(epoch.find("\"" #name "\":"), std::string::npos) << epoch
#define DPTRAIN_TEST_RUN_STATE_run(name, kept_in) \
  EXPECT_EQ(epoch.find("\"" #name "\":"), std::string::npos) << epoch
#include "dptrain/train/epoch_figures.def"
#undef DPTRAIN_TEST_RUN_STATE_run
#undef DPTRAIN_TEST_RUN_STATE_derived
#undef DPTRAIN_TEST_RUN_STATE_stats
#undef DPTRAIN_EPOCH_FIGURE
}

}  // namespace
}  // namespace dptrain
