// The driver's run records (app/run_records.h): a resumed history is written once, its steady
// seconds the same as the report's median over every prefix, and each epoch after it appended;
// the `lr` column follows the schedule.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dptrain/report/metrics.h"
#include "dptrain/report/report.h"
#include "dptrain/train/lr_schedule.h"
#include "run_records.h"
#include "support/cli_support.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

EpochStats epoch_with_seconds(int64_t epoch, double seconds) {
  EpochStats s;
  s.epoch = epoch;
  s.epochs = 10000;
  s.train_loss = 1.0 / static_cast<double>(epoch);
  s.test_acc = 0.5;
  s.seconds = seconds;
  s.steps = 3;
  return s;
}

// A resumed history is drawn once and its steady seconds are a running median, not re-sorted
// for every history epoch (quadratic). The running median must give the report's figure for
// every prefix, ties and even counts included.
TEST(RunRecords, ResumedHistoryIsWrittenOnceWithTheReportsSteadySeconds) {
  testing::TempDir dir;
  const std::string metrics = dir.file("m.csv");
  std::mt19937 random(3);
  std::vector<EpochStats> history;
  std::vector<double> seconds;
  for (int64_t epoch = 1; epoch <= 2001; ++epoch) {
    seconds.push_back(static_cast<double>(random() % 50) / 8);  // many equal values
    history.push_back(epoch_with_seconds(epoch, seconds.back()));
  }
  RunRecords records(metrics, dir.file("p.svg"), 0.1, 256, 10000, 4);
  records.start({"cpu"}, history);
  records.add(epoch_with_seconds(2002, 100.0));
  seconds.push_back(100.0);
  const auto lines = testing::split_lines(testing::read_text(metrics));
  ASSERT_EQ(lines.size(), 1u + 2002u);
  EXPECT_EQ(lines[0], metrics_csv_header());
  for (size_t i = 0; i < seconds.size(); ++i) {
    const std::vector<double> prefix(seconds.begin(), seconds.begin() + static_cast<long>(i) + 1);
    const auto expected = steady_epoch_seconds(prefix);
    EpochRecord record = make_epoch_record(history.size() > i ? history[i]
                                                              : epoch_with_seconds(2002, 100.0),
                                           0.1, {"cpu"});
    record.steady_seconds = expected.value_or(std::nan(""));
    ASSERT_EQ(lines[i + 1] + "\n", format_metrics_record(record, MetricsFormat::kCsv))
        << "epoch " << i + 1;
  }
  EXPECT_NE(testing::read_text(dir.file("p.svg")).find("</svg>"), std::string::npos);
}

// A failed --plot write (here its path became a directory; on a full disk the same) must not
// throw out of the epoch's callback and end the run before its checkpoint. It is reported once,
// the plot is dropped, and the metrics go on being written (Note [A failed record costs only
// itself] in run_records.cpp).
TEST(RunRecords, AFailedWriteDropsThatOutputAloneAndIsReportedOnce) {
  testing::TempDir dir;
  const std::string metrics = dir.file("m.csv");
  const std::string plot = dir.file("p.svg");
  RunRecords records(metrics, plot, 0.1, 256, 10000, 4);
  std::vector<std::string> reports;
  records.on_lost([&](const std::string& flag, const std::string& what) {
    reports.push_back(flag + ": " + what);
  });
  records.start({"cpu"}, {});  // no history: the plot is first drawn after epoch 1
  ASSERT_EQ(::mkdir(plot.c_str(), 0755), 0);
  testing::write_bytes(plot + "/x", {});
  EXPECT_NO_THROW(records.add(epoch_with_seconds(1, 1.0)));
  EXPECT_NO_THROW(records.add(epoch_with_seconds(2, 1.0)));
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].rfind("--plot: ", 0), 0u) << reports[0];
  EXPECT_NE(reports[0].find(plot), std::string::npos) << reports[0];
  EXPECT_EQ(records.lost(), std::vector<std::string>{"--plot"});
  EXPECT_EQ(testing::split_lines(testing::read_text(metrics)).size(), 3u);  // header, 2 epochs
}

// Under a schedule the `lr` column is the rate of each epoch's last step, for a resumed run's
// earlier epochs too; the base rate 0.5 makes every rate exact. One-cycle, 3 epochs of 4 steps,
// a 1-epoch warm-up: steps 3, 7 and 11 take 0.5 * 4/4, 0.5 * (12-7)/8 and 0.5 * (12-11)/8.
TEST(RunRecords, TheLrColumnIsTheRateOfEachEpochsLastStep) {
  testing::TempDir dir;
  const std::string metrics = dir.file("m.csv");
  RunRecords records(metrics, std::nullopt, 0.5, 256, 3, 4);
  LrSchedule schedule;
  schedule.shape = LrShape::kOneCycle;
  schedule.warmup_epochs = 1;
  records.follow_schedule(schedule);
  records.start({"cpu"}, {epoch_with_seconds(1, 1.0)});
  records.add(epoch_with_seconds(2, 1.0));
  records.add(epoch_with_seconds(3, 1.0));
  const auto lines = testing::split_lines(testing::read_text(metrics));
  ASSERT_EQ(lines.size(), 4u);
  const auto column = [](const std::string& line, size_t index) {
    std::vector<std::string> fields(1);
    for (const char c : line) {
      if (c == ',') {
        fields.emplace_back();
      } else {
        fields.back() += c;
      }
    }
    return fields.at(index);
  };
  size_t lr_index = 0;
  while (column(lines[0], lr_index) != "lr") ++lr_index;
  EXPECT_EQ(column(lines[1], lr_index), "0.5");
  EXPECT_EQ(column(lines[2], lr_index), "0.3125");
  EXPECT_EQ(column(lines[3], lr_index), "0.0625");
}

// The book's constant rate, and a run that names no schedule, write the base rate itself.
TEST(RunRecords, TheLrColumnOfAConstantRateIsTheBaseRate) {
  testing::TempDir dir;
  for (const bool follow : {false, true}) {
    const std::string metrics = dir.file(follow ? "a.csv" : "b.csv");
    RunRecords records(metrics, std::nullopt, 0.1, 256, 3, 4);
    if (follow) records.follow_schedule(LrSchedule{});
    records.start({"cpu"}, {});
    records.add(epoch_with_seconds(1, 1.0));
    const auto lines = testing::split_lines(testing::read_text(metrics));
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[1] + "\n",
              format_metrics_record(make_epoch_record(epoch_with_seconds(1, 1.0), 0.1, {"cpu"}),
                                    MetricsFormat::kCsv));
  }
}

}  // namespace
}  // namespace dptrain
