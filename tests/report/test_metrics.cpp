// Tests for metrics.h: the exact CSV and JSON Lines text, numbers that read back bit for bit, each
// epoch on disk before the next, and the errors for bad paths.
// Not here: the plot drawn from the records (test_plot.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/report/metrics.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::read_text;
using testing::TempDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

EpochRecord record(int64_t epoch, double train_loss, double train_acc, double test_loss,
                   double test_acc, double seconds, double images_per_second, double lr,
                   const std::string& devices) {
  EpochRecord r;
  r.epoch = epoch;
  r.train_loss = train_loss;
  r.train_acc = train_acc;
  r.test_loss = test_loss;
  r.test_acc = test_acc;
  r.seconds = seconds;
  r.images_per_second = images_per_second;
  r.lr = lr;
  r.devices = devices;
  return r;
}

// Two epochs on two CPU replicas; the second epoch's test loss is not finite.
std::vector<EpochRecord> two_epochs() {
  return {record(1, 0.5, 0.8125, 0.4375, 0.84375, 12.5, 4800, 0.1, "cpu,cpu"),
          record(2, 0.3, 0.9, kNaN, 0.875, 12.25, 4897.5, 0.1, "cpu,cpu")};
}

const char kCsvHeader[] =
    "epoch,train_loss,train_acc,test_loss,test_acc,seconds,images_per_second,lr,steady_seconds,"
    "wall_ms_per_step,gpu_ms_per_step,tflops,mfu,peak_host_bytes,peak_device_bytes,"
    "gpu_samples_dropped,gpu_spin_ms,devices,val_loss,val_acc,eval_seconds\n";
const char kCsvRows[] =
    "1,0.5,0.8125,0.4375,0.84375,12.5,4800,0.1,,,,,,,,,,\"cpu,cpu\",,,\n"
    "2,0.3,0.9,,0.875,12.25,4897.5,0.1,,,,,,,,,,\"cpu,cpu\",,,\n";
const char kJsonLines[] =
    "{\"epoch\":1,\"train_loss\":0.5,\"train_acc\":0.8125,\"test_loss\":0.4375,"
    "\"test_acc\":0.84375,\"seconds\":12.5,\"images_per_second\":4800,\"lr\":0.1,"
    "\"steady_seconds\":null,\"wall_ms_per_step\":null,\"gpu_ms_per_step\":null,"
    "\"tflops\":null,\"mfu\":null,\"peak_host_bytes\":null,\"peak_device_bytes\":null,"
    "\"gpu_samples_dropped\":null,\"gpu_spin_ms\":null,"
    "\"devices\":\"cpu,"
    "cpu\",\"val_loss\":null,\"val_acc\":null,\"eval_seconds\":null}\n"
    "{\"epoch\":2,\"train_loss\":0.3,\"train_acc\":0.9,\"test_loss\":null,"
    "\"test_acc\":0.875,\"seconds\":12.25,\"images_per_second\":4897.5,\"lr\":0.1,"
    "\"steady_seconds\":null,\"wall_ms_per_step\":null,\"gpu_ms_per_step\":null,"
    "\"tflops\":null,\"mfu\":null,\"peak_host_bytes\":null,\"peak_device_bytes\":null,"
    "\"gpu_samples_dropped\":null,\"gpu_spin_ms\":null,"
    "\"devices\":\"cpu,"
    "cpu\",\"val_loss\":null,\"val_acc\":null,\"eval_seconds\":null}\n";

// Same value, bit for bit (and NaN for NaN, as the file cannot tell NaNs apart).
void expect_same_double(double expected, double actual, const char* field) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(actual)) << field << " = " << actual;
  } else {
    EXPECT_EQ(expected, actual) << field;
    EXPECT_EQ(std::signbit(expected), std::signbit(actual)) << field;
  }
}

void expect_same_records(const std::vector<EpochRecord>& expected,
                         const std::vector<EpochRecord>& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    EXPECT_EQ(expected[i].epoch, actual[i].epoch);
    expect_same_double(expected[i].train_loss, actual[i].train_loss, "train_loss");
    expect_same_double(expected[i].train_acc, actual[i].train_acc, "train_acc");
    expect_same_double(expected[i].test_loss, actual[i].test_loss, "test_loss");
    expect_same_double(expected[i].test_acc, actual[i].test_acc, "test_acc");
    expect_same_double(expected[i].seconds, actual[i].seconds, "seconds");
    expect_same_double(expected[i].images_per_second, actual[i].images_per_second,
                       "images_per_second");
    expect_same_double(expected[i].lr, actual[i].lr, "lr");
    EXPECT_EQ(expected[i].devices, actual[i].devices);
  }
}

void write_records(const std::string& path, const std::vector<EpochRecord>& records) {
  MetricsWriter writer(path);
  for (const auto& r : records) writer.write(r);
}

// ============================================================================================
// Formats

TEST(MetricsText, ExtensionPicksTheFormat) {
  EXPECT_EQ(check_metrics_path("run.csv"), MetricsFormat::kCsv);
  EXPECT_EQ(check_metrics_path("/tmp/x/RUN.CSV"), MetricsFormat::kCsv);
  EXPECT_EQ(check_metrics_path("run.jsonl"), MetricsFormat::kJsonLines);
  EXPECT_EQ(check_metrics_path("a.b/run.ndjson"), MetricsFormat::kJsonLines);
}

TEST(MetricsText, OtherExtensionsAreUsageErrors) {
  for (const std::string path : {"run.txt", "run.json", "run", "csv", "dir.csv/run", ".csv"}) {
    SCOPED_TRACE(path);
    testing::expect_throws<UsageError>([&] { check_metrics_path(path); },
                                       {"--metrics", path, ".csv", ".jsonl", ".ndjson"});
  }
  TempDir dir;
  testing::expect_throws<UsageError>([&] { MetricsWriter writer(dir.file("run.txt")); },
                                     {"--metrics"});
  EXPECT_FALSE(testing::path_exists(dir.file("run.txt")));  // refused before creating anything
}

TEST(MetricsText, CsvTextIsExact) {
  TempDir dir;
  write_records(dir.file("m.csv"), two_epochs());
  EXPECT_EQ(read_text(dir.file("m.csv")), std::string(kCsvHeader) + kCsvRows);
  EXPECT_EQ(metrics_csv_header() + "\n", kCsvHeader);
}

TEST(MetricsText, JsonLinesTextIsExact) {
  TempDir dir;
  write_records(dir.file("m.jsonl"), two_epochs());
  EXPECT_EQ(read_text(dir.file("m.jsonl")), kJsonLines);
}

TEST(MetricsText, FieldsAreQuotedAndEscaped) {
  const EpochRecord r = record(3, 1, 1, 1, 1, 1, 1, 1, "a\"b,c\\d\ne\x01");
  EXPECT_EQ(format_metrics_record(r, MetricsFormat::kCsv),
            "3,1,1,1,1,1,1,1,,,,,,,,,,\"a\"\"b,c\\d\ne\x01\",,,\n");
  const std::string json = format_metrics_record(r, MetricsFormat::kJsonLines);
  EXPECT_NE(json.find("\"devices\":\"a\\\"b,c\\\\d\\ne\\u0001\",\"val_loss\":null,"),
            std::string::npos)
      << json;
  EXPECT_EQ(format_metrics_record(record(1, 1, 1, 1, 1, 1, 1, 1, "cpu"), MetricsFormat::kCsv),
            "1,1,1,1,1,1,1,1,,,,,,,,,,cpu,,,\n");  // nothing to quote
}

TEST(MetricsText, NonFiniteIsMissingNeverNanText) {
  const double inf = std::numeric_limits<double>::infinity();
  const EpochRecord r = record(1, kNaN, inf, -inf, 0.5, 1, 1, 0.1, "cpu");
  EXPECT_EQ(format_metrics_record(r, MetricsFormat::kCsv), "1,,,,0.5,1,1,0.1,,,,,,,,,,cpu,,,\n");
  EXPECT_EQ(format_metrics_record(r, MetricsFormat::kJsonLines),
            "{\"epoch\":1,\"train_loss\":null,\"train_acc\":null,\"test_loss\":null,"
            "\"test_acc\":0.5,\"seconds\":1,\"images_per_second\":1,\"lr\":0.1,"
            "\"steady_seconds\":null,\"wall_ms_per_step\":null,\"gpu_ms_per_step\":null,"
            "\"tflops\":null,\"mfu\":null,\"peak_host_bytes\":null,\"peak_device_bytes\":null,"
            "\"gpu_samples_dropped\":null,\"gpu_spin_ms\":null,"
            "\"devices\":\"cpu\",\"val_loss\":null,\"val_acc\":null,"
            "\"eval_seconds\":null}\n");
}

TEST(MetricsText, MakeEpochRecordJoinsDevices) {
  EpochStats stats;
  stats.epoch = 4;
  stats.epochs = 10;
  stats.train_loss = 0.25;
  stats.train_acc = 0.75;
  stats.test_loss = 0.5;
  stats.test_acc = 0.7;
  stats.seconds = 3;
  stats.images_per_second = 20000;
  const EpochRecord r = make_epoch_record(stats, 0.05, {"cuda:0", "cuda:1"});
  expect_same_records({record(4, 0.25, 0.75, 0.5, 0.7, 3, 20000, 0.05, "cuda:0,cuda:1")}, {r});
  EXPECT_TRUE(std::isnan(r.wall_ms_per_step));  // no steps counted: no pace per step
  EXPECT_TRUE(std::isnan(r.gpu_ms_per_step));
  // An epoch without efficiency figures (a resumed run's history) leaves them missing.
  EXPECT_TRUE(std::isnan(r.tflops));
  EXPECT_TRUE(std::isnan(r.mfu));
  EXPECT_TRUE(std::isnan(r.peak_host_bytes));
  EXPECT_TRUE(std::isnan(r.peak_device_bytes));
}

// The efficiency figures are carried over as the epoch has them, and written after the step
// times: all four on a GPU with a known peak; on the CPU without --peak-tflops, no MFU and no GPU.
TEST(MetricsText, EfficiencyFiguresAreCarriedOverAndMissingWhereUnknown) {
  EpochStats stats;
  stats.epoch = 2;
  stats.seconds = 0.75;
  stats.steps = 250;
  stats.gpu_ms_per_step = 1.25;
  stats.tflops = 312.5;
  stats.mfu = 0.3159;
  stats.peak_host_bytes = 2147483648.0;
  stats.peak_device_bytes = 12992272384.0;
  const EpochRecord gpu = make_epoch_record(stats, 0.1, {"cuda:0"});
  EXPECT_EQ(gpu.tflops, 312.5);
  EXPECT_EQ(gpu.mfu, 0.3159);
  EXPECT_EQ(gpu.peak_host_bytes, 2147483648.0);
  EXPECT_EQ(gpu.peak_device_bytes, 12992272384.0);
  EXPECT_EQ(format_metrics_record(gpu, MetricsFormat::kCsv),
            "2,0,0,0,0,0.75,0,0.1,,3,1.25,312.5,0.3159,2147483648,12992272384,,,cuda:0,,,\n");
  EXPECT_NE(format_metrics_record(gpu, MetricsFormat::kJsonLines)
                .find("\"gpu_ms_per_step\":1.25,\"tflops\":312.5,\"mfu\":0.3159,"
                      "\"peak_host_bytes\":2147483648,\"peak_device_bytes\":12992272384,"
                      "\"gpu_samples_dropped\":null,\"gpu_spin_ms\":null,"
                      "\"devices\":\"cuda:0\",\"val_loss\":null"),
            std::string::npos);
  stats.gpu_ms_per_step = kNaN;
  stats.tflops = 0.0382;
  stats.mfu = kNaN;
  stats.peak_device_bytes = kNaN;
  EXPECT_EQ(format_metrics_record(make_epoch_record(stats, 0.1, {"cpu"}), MetricsFormat::kCsv),
            "2,0,0,0,0,0.75,0,0.1,,3,,0.0382,,2147483648,,,,cpu,,,\n");
}

// A run with a validation set (--val-split) writes its loss and accuracy, and every run the
// seconds of its evaluations, in the last columns.
TEST(MetricsText, ValidationFiguresAndEvaluationSecondsAreTheLastColumns) {
  EpochStats stats;
  stats.epoch = 1;
  stats.val_loss = 0.25;
  stats.val_acc = 0.875;
  stats.eval_seconds = 1.5;
  const EpochRecord r = make_epoch_record(stats, 0.1, {"cpu"});
  EXPECT_EQ(format_metrics_record(r, MetricsFormat::kCsv),
            "1,0,0,0,0,0,0,0.1,,,,,,,,,,cpu,0.25,0.875,1.5\n");
  EXPECT_NE(format_metrics_record(r, MetricsFormat::kJsonLines)
                .find("\"devices\":\"cpu\",\"val_loss\":0.25,\"val_acc\":0.875,"
                      "\"eval_seconds\":1.5}\n"),
            std::string::npos);
}

// The wall time per step is the epoch's training seconds over its steps, in milliseconds; the
// GPU time is carried over as measured, and written beside it.
TEST(MetricsText, StepTimesAreTheEpochsWallPaceAndItsGpuMedian) {
  EpochStats stats;
  stats.epoch = 2;
  stats.seconds = 0.75;
  stats.steps = 250;
  stats.gpu_ms_per_step = 1.25;
  const EpochRecord r = make_epoch_record(stats, 0.1, {"cuda:0"});
  EXPECT_EQ(r.wall_ms_per_step, 3.0);
  EXPECT_EQ(r.gpu_ms_per_step, 1.25);
  EXPECT_NE(format_metrics_record(r, MetricsFormat::kJsonLines)
                .find("\"wall_ms_per_step\":3,\"gpu_ms_per_step\":1.25,"),
            std::string::npos);
  EXPECT_EQ(format_metrics_record(r, MetricsFormat::kCsv),
            "2,0,0,0,0,0.75,0,0.1,,3,1.25,,,,,,,cuda:0,,,\n");
}

// What the step timer dropped and spun in the epoch is carried over, beside the epoch's
// seconds; missing where nothing was timed.
TEST(MetricsText, TimerDropsAndSpinsAreCarriedOver) {
  EpochStats stats;
  stats.epoch = 3;
  stats.seconds = 0.75;
  stats.steps = 250;
  stats.gpu_samples_dropped = 3;
  stats.gpu_spin_ms = 6.25;
  const EpochRecord r = make_epoch_record(stats, 0.1, {"cuda:0"});
  EXPECT_EQ(r.gpu_samples_dropped, 3);
  EXPECT_EQ(r.gpu_spin_ms, 6.25);
  EXPECT_EQ(format_metrics_record(r, MetricsFormat::kCsv),
            "3,0,0,0,0,0.75,0,0.1,,3,,,,,,3,6.25,cuda:0,,,\n");
  EXPECT_NE(format_metrics_record(r, MetricsFormat::kJsonLines)
                .find("\"gpu_samples_dropped\":3,\"gpu_spin_ms\":6.25,\"devices\""),
            std::string::npos);
  EXPECT_TRUE(std::isnan(make_epoch_record(EpochStats{}, 0.1, {"cpu"}).gpu_spin_ms));
}

// ============================================================================================
// Round trips

// The numbers of each record in `text` (CSV rows or JSON Lines), in column order from epoch to lr,
// read with strtod; a missing value is NaN. Enough parsing for records whose devices hold no
// newline: the numbers come first, so the first eight comma-separated pieces are they (in JSON,
// after their "key":).
std::vector<std::vector<double>> numbers_in(const std::string& text) {
  std::vector<std::vector<double>> rows;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream pieces(line);
    std::vector<double> row;
    for (std::string piece; row.size() < 8 && std::getline(pieces, piece, ',');) {
      piece = piece.substr(piece.rfind(':') + 1);  // npos + 1 == 0: the whole CSV field
      char* end = nullptr;
      row.push_back(piece.empty() || piece == "null" ? kNaN : std::strtod(piece.c_str(), &end));
      if (end != nullptr) {
        EXPECT_EQ(*end, '\0') << "not a number: " << piece;
      }
    }
    rows.push_back(row);
  }
  return rows;
}

class MetricsRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(MetricsRoundTrip, NumbersReadBackBitForBit) {
  TempDir dir;
  const std::string path = dir.file("m." + GetParam());
  std::vector<EpochRecord> records = two_epochs();
  records.push_back(record(3, 1.0 / 3, 0.1 + 0.2, 1e-300, std::numeric_limits<double>::max(),
                           5e-324, -0.0, 2.0 / 3, "cuda:0"));
  records.push_back(
      record(-1, 123456789.123456789, 0.7, 6.02214076e23, 0, 0.015625, 1e22, 1e-5, ""));
  write_records(path, records);
  std::string text = read_text(path);
  if (GetParam() == "csv") {
    ASSERT_EQ(text.rfind(kCsvHeader, 0), 0u);
    text = text.substr(sizeof kCsvHeader - 1);
  }
  const std::vector<std::vector<double>> rows = numbers_in(text);
  ASSERT_EQ(rows.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    const EpochRecord& r = records[i];
    ASSERT_EQ(rows[i].size(), 8u);
    EXPECT_EQ(rows[i][0], static_cast<double>(r.epoch));
    expect_same_double(r.train_loss, rows[i][1], "train_loss");
    expect_same_double(r.train_acc, rows[i][2], "train_acc");
    expect_same_double(r.test_loss, rows[i][3], "test_loss");
    expect_same_double(r.test_acc, rows[i][4], "test_acc");
    expect_same_double(r.seconds, rows[i][5], "seconds");
    expect_same_double(r.images_per_second, rows[i][6], "images_per_second");
    expect_same_double(r.lr, rows[i][7], "lr");
  }
}

INSTANTIATE_TEST_SUITE_P(Metrics, MetricsRoundTrip, ::testing::Values("csv", "jsonl", "ndjson"));

TEST(MetricsWriter, EachRecordIsOnDiskBeforeTheNextEpoch) {
  TempDir dir;
  MetricsWriter writer(dir.file("m.csv"));
  EXPECT_EQ(read_text(dir.file("m.csv")), "");  // the header comes with the first record
  writer.write(two_epochs()[0]);
  // Read through another descriptor while the writer is still open, as after a crash.
  EXPECT_EQ(read_text(dir.file("m.csv")),
            std::string(kCsvHeader) +
                "1,0.5,0.8125,0.4375,0.84375,12.5,4800,0.1,,,,,,,,,,\"cpu,cpu\",,,\n");
  writer.write(two_epochs()[1]);
  EXPECT_EQ(read_text(dir.file("m.csv")), std::string(kCsvHeader) + kCsvRows);
}

TEST(MetricsWriter, AnExistingFileStartsOver) {
  TempDir dir;
  const std::string path = dir.file("m.csv");
  write_text(path, "step,loss\n1,0.5\n2,0.");
  write_records(path, two_epochs());
  EXPECT_EQ(read_text(path), std::string(kCsvHeader) + kCsvRows);
  write_records(path, {two_epochs()[1]});
  write_records(path, two_epochs());
  EXPECT_EQ(read_text(path), std::string(kCsvHeader) + kCsvRows);
}

TEST(MetricsWriter, UnwritablePathIsADataError) {
  TempDir dir;
  const std::string missing_dir = dir.file("no/such/dir/m.csv");
  testing::expect_data_error([&] { MetricsWriter writer(missing_dir); },
                             {missing_dir, "No such file or directory"});
  testing::make_directories(dir.file("a_directory.jsonl"));
  testing::expect_data_error([&] { MetricsWriter writer(dir.file("a_directory.jsonl")); },
                             {dir.file("a_directory.jsonl")});
}

}  // namespace
}  // namespace dptrain
