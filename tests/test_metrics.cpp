// Tests for metrics.h: the exact CSV and JSON Lines text, bit-exact round trips, appending after a
// resume (no second header, a cut-off line dropped) and the errors for bad paths and bad files.
// Not here: the plot drawn from the records (test_plot.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "dptrain/errors.h"
#include "dptrain/metrics.h"
#include "test_support.h"

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
    "devices\n";
const char kCsvRows[] =
    "1,0.5,0.8125,0.4375,0.84375,12.5,4800,0.1,,\"cpu,cpu\"\n"
    "2,0.3,0.9,,0.875,12.25,4897.5,0.1,,\"cpu,cpu\"\n";
const char kJsonLines[] =
    "{\"epoch\":1,\"train_loss\":0.5,\"train_acc\":0.8125,\"test_loss\":0.4375,"
    "\"test_acc\":0.84375,\"seconds\":12.5,\"images_per_second\":4800,\"lr\":0.1,"
    "\"steady_seconds\":null,\"devices\":\"cpu,cpu\"}\n"
    "{\"epoch\":2,\"train_loss\":0.3,\"train_acc\":0.9,\"test_loss\":null,"
    "\"test_acc\":0.875,\"seconds\":12.25,\"images_per_second\":4897.5,\"lr\":0.1,"
    "\"steady_seconds\":null,\"devices\":\"cpu,cpu\"}\n";

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

void write_all(const std::string& path, const std::vector<EpochRecord>& records,
               bool append = false) {
  MetricsWriter writer(path, append);
  for (const auto& r : records) writer.write(r);
}

template <typename Exception>
void expect_throw_naming(const std::function<void()>& action,
                         const std::vector<std::string>& phrases) {
  try {
    action();
    ADD_FAILURE() << "nothing was thrown";
  } catch (const Exception& error) {
    const std::string message = error.what();
    for (const auto& phrase : phrases) {
      EXPECT_NE(message.find(phrase), std::string::npos)
          << "the message lacks \"" << phrase << "\": " << message;
    }
  }
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
    expect_throw_naming<UsageError>([&] { check_metrics_path(path); },
                                    {"--metrics", path, ".csv", ".jsonl", ".ndjson"});
  }
  TempDir dir;
  expect_throw_naming<UsageError>([&] { MetricsWriter writer(dir.file("run.txt")); },
                                  {"--metrics"});
  EXPECT_FALSE(testing::path_exists(dir.file("run.txt")));  // refused before creating anything
}

TEST(MetricsText, CsvTextIsExact) {
  TempDir dir;
  write_all(dir.file("m.csv"), two_epochs());
  EXPECT_EQ(read_text(dir.file("m.csv")), std::string(kCsvHeader) + kCsvRows);
  EXPECT_EQ(metrics_csv_header() + "\n", kCsvHeader);
}

TEST(MetricsText, JsonLinesTextIsExact) {
  TempDir dir;
  write_all(dir.file("m.jsonl"), two_epochs());
  EXPECT_EQ(read_text(dir.file("m.jsonl")), kJsonLines);
}

TEST(MetricsText, FieldsAreQuotedAndEscaped) {
  const EpochRecord r = record(3, 1, 1, 1, 1, 1, 1, 1, "a\"b,c\\d\ne\x01");
  EXPECT_EQ(format_metrics_record(r, MetricsFormat::kCsv),
            "3,1,1,1,1,1,1,1,,\"a\"\"b,c\\d\ne\x01\"\n");
  const std::string json = format_metrics_record(r, MetricsFormat::kJsonLines);
  EXPECT_NE(json.find("\"devices\":\"a\\\"b,c\\\\d\\ne\\u0001\"}\n"), std::string::npos) << json;
  EXPECT_EQ(format_metrics_record(record(1, 1, 1, 1, 1, 1, 1, 1, "cpu"), MetricsFormat::kCsv),
            "1,1,1,1,1,1,1,1,,cpu\n");  // nothing to quote
}

TEST(MetricsText, NonFiniteIsMissingNeverNanText) {
  const double inf = std::numeric_limits<double>::infinity();
  const EpochRecord r = record(1, kNaN, inf, -inf, 0.5, 1, 1, 0.1, "cpu");
  EXPECT_EQ(format_metrics_record(r, MetricsFormat::kCsv), "1,,,,0.5,1,1,0.1,,cpu\n");
  EXPECT_EQ(format_metrics_record(r, MetricsFormat::kJsonLines),
            "{\"epoch\":1,\"train_loss\":null,\"train_acc\":null,\"test_loss\":null,"
            "\"test_acc\":0.5,\"seconds\":1,\"images_per_second\":1,\"lr\":0.1,"
            "\"steady_seconds\":null,\"devices\":\"cpu\"}\n");
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
}

// ============================================================================================
// Round trips

class MetricsRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(MetricsRoundTrip, ReadsBackBitForBit) {
  TempDir dir;
  const std::string path = dir.file("m." + GetParam());
  std::vector<EpochRecord> records = two_epochs();
  records.push_back(record(3, 1.0 / 3, 0.1 + 0.2, 1e-300, std::numeric_limits<double>::max(),
                           5e-324, -0.0, 2.0 / 3, "cuda:0,\"odd\" name\n\\ é"));
  records.push_back(
      record(-1, 123456789.123456789, 0.7, 6.02214076e23, 0, 0.015625, 1e22, 1e-5, ""));
  write_all(path, records);
  expect_same_records(records, read_metrics(path));
}

INSTANTIATE_TEST_SUITE_P(Metrics, MetricsRoundTrip, ::testing::Values("csv", "jsonl", "ndjson"));

TEST(MetricsWriter, EachRecordIsOnDiskBeforeTheNextEpoch) {
  TempDir dir;
  MetricsWriter writer(dir.file("m.csv"));
  EXPECT_EQ(read_text(dir.file("m.csv")), "");  // the header comes with the first record
  writer.write(two_epochs()[0]);
  // Read through another descriptor while the writer is still open, as after a crash.
  EXPECT_EQ(read_metrics(dir.file("m.csv")).size(), 1u);
  writer.write(two_epochs()[1]);
  EXPECT_EQ(read_metrics(dir.file("m.csv")).size(), 2u);
}

// ============================================================================================
// Appending after a resume

TEST(MetricsWriter, AppendAddsNoSecondHeader) {
  TempDir dir;
  const std::string path = dir.file("m.csv");
  write_all(path, {two_epochs()[0]});
  write_all(path, {two_epochs()[1]}, /*append=*/true);
  EXPECT_EQ(read_text(path), std::string(kCsvHeader) + kCsvRows);
}

TEST(MetricsWriter, AppendToAMissingOrEmptyFileWritesTheHeader) {
  TempDir dir;
  write_all(dir.file("new.csv"), two_epochs(), /*append=*/true);
  EXPECT_EQ(read_text(dir.file("new.csv")), std::string(kCsvHeader) + kCsvRows);
  write_text(dir.file("empty.csv"), "");
  write_all(dir.file("empty.csv"), two_epochs(), /*append=*/true);
  EXPECT_EQ(read_text(dir.file("empty.csv")), std::string(kCsvHeader) + kCsvRows);
}

TEST(MetricsWriter, AppendJsonLines) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  write_all(path, {two_epochs()[0]});
  write_all(path, {two_epochs()[1]}, /*append=*/true);
  EXPECT_EQ(read_text(path), kJsonLines);
}

TEST(MetricsWriter, AppendDropsALineCutShortByACrash) {
  TempDir dir;
  const std::string csv = dir.file("m.csv");
  write_text(csv, std::string(kCsvHeader) +
                      "1,0.5,0.8125,0.4375,0.84375,12.5,4800,0.1,,\"cpu,cpu\"\n"
                      "2,0.3,0.");
  write_all(csv, {two_epochs()[1]}, /*append=*/true);
  EXPECT_EQ(read_text(csv), std::string(kCsvHeader) + kCsvRows);

  const std::string jsonl = dir.file("m.jsonl");
  write_text(jsonl, "{\"epoch\":1,\"train_lo");
  write_all(jsonl, two_epochs(), /*append=*/true);
  EXPECT_EQ(read_text(jsonl), kJsonLines);
}

TEST(MetricsWriter, AppendRefusesACsvWithAnotherHeader) {
  TempDir dir;
  const std::string path = dir.file("m.csv");
  write_text(path, "step,loss\n1,0.5\n");
  testing::expect_data_error([&] { MetricsWriter writer(path, /*append=*/true); },
                             {path, "header"});
  EXPECT_EQ(read_text(path), "step,loss\n1,0.5\n");  // left as it was
}

TEST(MetricsWriter, WithoutAppendTheFileStartsOver) {
  TempDir dir;
  const std::string path = dir.file("m.csv");
  write_all(path, {two_epochs()[1]});
  write_all(path, two_epochs());
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

// ============================================================================================
// Reading bad files

TEST(MetricsReader, EmptyFileAndBlankLines) {
  TempDir dir;
  write_text(dir.file("empty.csv"), "");
  EXPECT_TRUE(read_metrics(dir.file("empty.csv")).empty());
  write_text(dir.file("header.csv"), kCsvHeader);
  EXPECT_TRUE(read_metrics(dir.file("header.csv")).empty());
  write_text(dir.file("blank.csv"), std::string("\n") + kCsvHeader + "\n" + kCsvRows + "\r\n\n");
  expect_same_records(two_epochs(), read_metrics(dir.file("blank.csv")));
  write_text(dir.file("blank.jsonl"), std::string("\n  \n") + kJsonLines + "\n");
  expect_same_records(two_epochs(), read_metrics(dir.file("blank.jsonl")));
}

TEST(MetricsReader, WindowsLineEndingsAndUnknownJsonKeys) {
  TempDir dir;
  std::string crlf = std::string(kCsvHeader) + kCsvRows;
  for (size_t at = crlf.find('\n'); at != std::string::npos; at = crlf.find('\n', at + 2)) {
    crlf.insert(at, "\r");
  }
  write_text(dir.file("crlf.csv"), crlf);
  expect_same_records(two_epochs(), read_metrics(dir.file("crlf.csv")));
  write_text(dir.file("extra.jsonl"),
             "{ \"note\" : \"x\\u00e9\\ud83d\\ude00\", \"epoch\":1,\"train_loss\":5E-1,"
             "\"train_acc\":0.8125,\"test_loss\":0.4375,\"test_acc\":0.84375,\"seconds\":12.5,"
             "\"images_per_second\":4.8e3,\"lr\":0.1,\"devices\":\"cpu\\u002ccpu\"}\n");
  expect_same_records({two_epochs()[0]}, read_metrics(dir.file("extra.jsonl")));
}

TEST(MetricsReader, MissingFileIsADataError) {
  TempDir dir;
  testing::expect_data_error([&] { read_metrics(dir.file("absent.csv")); },
                             {dir.file("absent.csv"), "No such file or directory"});
}

struct BadFile {
  const char* name;
  const char* extension;
  const char* content;
  const char* phrase;  // the message must name it, as well as the path
};

class MetricsBadFile : public ::testing::TestWithParam<BadFile> {};

TEST_P(MetricsBadFile, IsADataErrorNamingTheLine) {
  TempDir dir;
  const std::string path = dir.file(std::string("bad.") + GetParam().extension);
  write_text(path, GetParam().content);
  testing::expect_data_error([&] { read_metrics(path); }, {path, GetParam().phrase});
}

const char kRow1[] = "1,0.5,0.8125,0.4375,0.84375,12.5,4800,0.1,,cpu\n";

INSTANTIATE_TEST_SUITE_P(
    Metrics, MetricsBadFile,
    ::testing::Values(
        BadFile{"CsvOtherHeader", "csv", "epoch,loss\n1,2\n", "line 1: the header"},
        BadFile{"CsvFewFields", "csv",
                "epoch,train_loss,train_acc,test_loss,test_acc,seconds,images_per_second,lr,"
                "steady_seconds,devices\n1,0.5\n",
                "line 2: 2 fields, expected 10"},
        BadFile{"CsvBadNumber", "csv",
                "epoch,train_loss,train_acc,test_loss,test_acc,seconds,images_per_second,lr,"
                "steady_seconds,devices\n1,abc,1,1,1,1,1,1,,cpu\n",
                "line 2: train_loss \"abc\""},
        BadFile{"CsvFractionalEpoch", "csv",
                "epoch,train_loss,train_acc,test_loss,test_acc,seconds,images_per_second,lr,"
                "steady_seconds,devices\n1.5,1,1,1,1,1,1,1,,cpu\n",
                "line 2: epoch \"1.5\""},
        BadFile{"CsvUnclosedQuote", "csv",
                "epoch,train_loss,train_acc,test_loss,test_acc,seconds,images_per_second,lr,"
                "steady_seconds,devices\n1,1,1,1,1,1,1,1,,\"cpu\n",
                "line 2: a quoted field is never closed"},
        BadFile{"CsvTextAfterQuote", "csv",
                "epoch,train_loss,train_acc,test_loss,test_acc,seconds,images_per_second,lr,"
                "steady_seconds,devices\n1,1,1,1,1,1,1,1,,\"cpu\"x\n",
                "line 2: text after a closing quote"},
        BadFile{"CsvBinary", "csv", "\x89PNG\r\n\x1a\n\xff\xfe", "line 1"},
        BadFile{"JsonNotAnObject", "jsonl", "[1,2]\n", "line 1: expected '{'"},
        BadFile{"JsonMissingField", "jsonl", "{\"epoch\":1}\n", "line 1: no \"train_loss\""},
        BadFile{"JsonCutShort", "jsonl", "{\"epoch\":1,", "line 1"},
        BadFile{"JsonNested", "jsonl", "{\"epoch\":{\"a\":1}}", "line 1: the value of \"epoch\""},
        BadFile{"JsonBoolean", "jsonl", "{\"epoch\":true}", "line 1: the value of \"epoch\""},
        BadFile{"JsonTrailingText", "jsonl", "{\"epoch\":1} x", "line 1: text after"},
        BadFile{"JsonBadEscape", "jsonl", "{\"e\\q\":1}", "line 1: an unknown escape"},
        BadFile{"JsonLoneSurrogate", "jsonl", "{\"e\\ud800\":1}", "line 1: a lone UTF-16"},
        BadFile{"JsonBadNumber", "jsonl",
                "\n{\"epoch\":1,\"train_loss\":1e,\"train_acc\":1,\"test_loss\":1,"
                "\"test_acc\":1,\"seconds\":1,\"images_per_second\":1,\"lr\":1,\"devices\":\"\"}",
                "line 2: train_loss \"1e\""},
        BadFile{"JsonNullEpoch", "jsonl",
                "{\"epoch\":null,\"train_loss\":1,\"train_acc\":1,\"test_loss\":1,"
                "\"test_acc\":1,\"seconds\":1,\"images_per_second\":1,\"lr\":1,\"devices\":\"\"}",
                "line 1: epoch"},
        BadFile{"JsonControlCharacter", "jsonl", "{\"a\x01\":1}", "line 1: a control character"}),
    [](const ::testing::TestParamInfo<BadFile>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace dptrain
