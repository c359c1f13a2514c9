// The driver's run records (app/run_records.h): a resumed history is written once, its steady
// seconds the same as the report's median over every prefix, and each epoch after it appended.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/cli_support.h"
#include "dptrain/report/metrics.h"
#include "dptrain/report/report.h"
#include "run_records.h"
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
  RunRecords records(metrics, dir.file("p.svg"), 0.1, 256, 10000);
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
  RunRecords records(metrics, plot, 0.1, 256, 10000);
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

}  // namespace
}  // namespace dptrain
