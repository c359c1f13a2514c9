// Tests for tensorboard.h: the CRC-32C and record framing byte for byte (values from TensorBoard's
// own pywrap_tensorflow stub), an event file parsed back record by record with the generated
// protobuf code (decode_tensorboard_event), what a run logs and where, and the errors for bad
// directories and failed writes.
// Not here: TensorBoard's own reader on a real run (tests/integration/test_tensorboard.py).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/report/tensorboard.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::TempDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

#if defined(DPTRAIN_WITH_TENSORBOARD)

// ---- The framing -----------------------------------------------------------------------------

// CRC-32C's check value and RFC 3720's (iSCSI) vectors: ISA-L's convention is pinned here.
TEST(TensorBoardCrc, Crc32cOfTheStandardVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xff);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
}

// ((crc >> 15) | (crc << 17)) + 0xa282ead8: 0xE3069283 rotates to 0x2507F1A7 (+ the constant).
TEST(TensorBoardCrc, MaskedCrcAsTensorBoardComputesIt) {
  EXPECT_EQ(masked_crc32c("123456789", 9), 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c("", 0), 0xA282EAD8u);
}

TEST(TensorBoardRecord, FramingIsByteExact) {
  const std::string record = frame_tensorboard_record("abc");
  const std::vector<unsigned char> expected{
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // length 3, uint64 little-endian
      0xb0, 0x99, 0x49, 0x0e,                          // masked CRC of those 8 bytes
      0x61, 0x62, 0x63,                                // "abc"
      0x6e, 0x57, 0xf1, 0x21};                         // masked CRC of "abc"
  EXPECT_EQ(std::vector<unsigned char>(record.begin(), record.end()), expected);
  EXPECT_EQ(frame_tensorboard_record("").size(), 16u);
}

// ---- Reading a file back ---------------------------------------------------------------------

uint32_t read_le(const std::string& bytes, size_t at, int size) {
  uint64_t value = 0;
  for (int i = size - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[at + static_cast<size_t>(i)]);
  }
  return static_cast<uint32_t>(value);
}

// Every event of `path`, each record's checksums checked.
std::vector<DecodedTensorBoardEvent> read_events(const std::string& path) {
  const std::string bytes = testing::read_text(path);
  std::vector<DecodedTensorBoardEvent> events;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_GE(bytes.size() - at, 16u) << "a record cut short at byte " << at;
    if (bytes.size() - at < 16) break;
    const uint64_t length = read_le(bytes, at, 4) | (uint64_t{read_le(bytes, at + 4, 4)} << 32);
    EXPECT_EQ(read_le(bytes, at + 8, 4), masked_crc32c(bytes.data() + at, 8));
    const std::string data = bytes.substr(at + 12, length);
    EXPECT_EQ(read_le(bytes, at + 12 + length, 4), masked_crc32c(data.data(), data.size()));
    DecodedTensorBoardEvent event;
    EXPECT_TRUE(decode_tensorboard_event(data, event)) << "event " << events.size();
    events.push_back(event);
    at += 16 + length;
  }
  return events;
}

std::string only_event_file(const TempDir& dir) {
  const auto names = testing::list_directory(dir.path());
  EXPECT_EQ(names.size(), 1u);
  return names.empty() ? "" : dir.file(names.front());
}

TEST(TensorBoardWriter, WritesTheVersionThenEachEventParsedBack) {
  TempDir dir;
  std::string path;
  {
    TensorBoardWriter writer(dir.path());
    path = writer.path();
    writer.write_session_start(5);
    writer.write_text(5, "run/settings", "| a | b |");
    writer.write_scalars(7, {{"epoch/train_loss", 0.25}, {"epoch/test_acc", 0.1}});
    writer.sync();
  }
  const std::string name = path.substr(dir.path().size() + 1);
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find("." + std::to_string(::getpid())), std::string::npos) << name;
  EXPECT_EQ(only_event_file(dir), path);

  const auto events = read_events(path);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[0].step, 0);
  EXPECT_GT(events[0].wall_time, 1.7e9);  // seconds since 1970, not milliseconds or zero

  EXPECT_TRUE(events[1].session_start);
  EXPECT_EQ(events[1].step, 5);

  ASSERT_EQ(events[2].values.size(), 1u);
  const auto& text = events[2].values[0];
  EXPECT_EQ(text.tag, "run/settings");
  EXPECT_EQ(text.plugin_name, "text");
  EXPECT_EQ(text.dtype, 7);  // DT_STRING
  EXPECT_EQ(text.dims, 0);
  ASSERT_EQ(text.strings.size(), 1u);
  EXPECT_EQ(text.strings[0], "| a | b |");

  EXPECT_EQ(events[3].step, 7);
  ASSERT_EQ(events[3].values.size(), 2u);
  EXPECT_EQ(events[3].values[0].tag, "epoch/train_loss");
  EXPECT_EQ(events[3].values[0].simple_value, 0.25f);
  EXPECT_EQ(events[3].values[1].tag, "epoch/test_acc");
  EXPECT_EQ(events[3].values[1].simple_value, 0.1f);  // float32, as TensorBoard

  DecodedTensorBoardEvent none;
  EXPECT_FALSE(decode_tensorboard_event("\x0a\xff", none));  // a field cut short
}

// TensorBoard reads a directory's files in name order: a run's file must come after an earlier
// one, even one named for a later second (two runs in one second, or a clock set back).
TEST(TensorBoardWriter, ANewFileSortsAfterTheFilesAlreadyThere) {
  TempDir dir;
  const long long ahead = static_cast<long long>(std::time(nullptr)) + 1000;
  const std::string later = "events.out.tfevents." + std::to_string(ahead) + ".zzz.99999";
  testing::write_bytes(dir.file(later), {});
  TensorBoardWriter writer(dir.path());
  const std::string name = writer.path().substr(dir.path().size() + 1);
  EXPECT_EQ(name.rfind("events.out.tfevents." + std::to_string(ahead + 1) + ".", 0), 0u) << name;
  EXPECT_GT(name, later);
}

// Writes events until a 4 KiB file-size limit stops them; exits 3 after printing the DataError.
void write_past_a_size_limit(const std::string& dir) {
  TensorBoardWriter writer(dir);
  std::signal(SIGXFSZ, SIG_IGN);  // a failed write(2), EFBIG, as a full disk gives ENOSPC
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = 4096;
  ::setrlimit(RLIMIT_FSIZE, &limit);
  try {
    for (int step = 1; step < 100000; ++step) writer.write_scalars(step, {{"a", 1.0}});
  } catch (const DataError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(3);
  }
  std::exit(0);
}

// A full disk, as a file-size limit: one DataError naming the file, in a child process (the
// limit and the signal's disposition are process-wide).
TEST(TensorBoardWriterDeathTest, AFailedWriteIsOneErrorNamingTheFile) {
  TempDir dir;
  EXPECT_EXIT(write_past_a_size_limit(dir.path()), ::testing::ExitedWithCode(3),
              "cannot write TensorBoard event file .*events\\.out\\.tfevents\\..*: File too large");
}

// ---- What a run logs -------------------------------------------------------------------------

EpochStats stats_of_epoch(int64_t epoch, int64_t steps) {
  EpochStats s;
  s.epoch = epoch;
  s.epochs = 3;
  s.train_loss = 0.5;
  s.train_acc = 0.75;
  s.test_loss = 0.625;
  s.test_acc = 0.875;
  s.seconds = 2.0;
  s.images_per_second = 1000.0;
  s.steps = steps;
  return s;
}

std::vector<std::string> tags_of(const std::vector<TensorBoardScalar>& scalars) {
  std::vector<std::string> tags;
  for (const auto& s : scalars) tags.push_back(s.tag);
  return tags;
}

TEST(TensorBoardLog, EpochScalarsLeaveOutWhatIsUnknown) {
  EpochStats cpu = stats_of_epoch(1, 4);  // NaN: GPU time, TFLOP/s, MFU, peak bytes
  const auto scalars = epoch_scalars(cpu);
  EXPECT_EQ(tags_of(scalars),
            (std::vector<std::string>{"epoch/train_loss", "epoch/train_acc", "epoch/test_loss",
                                      "epoch/test_acc", "epoch/seconds",
                                      "epoch/images_per_second", "epoch/wall_ms_per_step"}));
  EXPECT_EQ(scalars[0].value, 0.5);
  EXPECT_EQ(scalars[6].value, 500.0);  // 2 s over 4 steps

  EpochStats gpu = cpu;
  gpu.gpu_ms_per_step = 1.5;
  gpu.tflops = 312.0;
  gpu.mfu = 0.3125;
  gpu.peak_host_bytes = 1e9;
  gpu.peak_device_bytes = 2e9;
  const auto all = epoch_scalars(gpu);
  ASSERT_EQ(all.size(), 12u);
  EXPECT_EQ(all[7].tag, "epoch/gpu_ms_per_step");
  EXPECT_EQ(all[8].tag, "epoch/tflops");
  EXPECT_EQ(all[8].value, 312.0);
  EXPECT_EQ(all[9].tag, "epoch/mfu");
  EXPECT_EQ(all[10].tag, "epoch/peak_host_bytes");
  EXPECT_EQ(all[11].tag, "epoch/peak_device_bytes");
  EXPECT_EQ(all[11].value, 2e9);
  gpu.mfu = kNaN;  // an unknown GPU: no peak, no MFU
  EXPECT_EQ(epoch_scalars(gpu).size(), 11u);
}

// An epoch without a trained step: no training point, the test's and the pace's kept.
TEST(TensorBoardLog, AnEpochWithoutATrainedStepHasNoTrainingScalars) {
  EpochStats none = stats_of_epoch(2, 4);
  none.train_loss = kNaN;
  none.train_acc = kNaN;
  none.images_per_second = kNaN;
  none.skipped_steps = 4;
  EXPECT_EQ(tags_of(epoch_scalars(none)),
            (std::vector<std::string>{"epoch/test_loss", "epoch/test_acc", "epoch/seconds",
                                      "epoch/wall_ms_per_step"}));
}

// A run with a validation set (--val-split) logs its loss and accuracy after the others; the
// evaluations' seconds go to the metrics file only.
TEST(TensorBoardLog, ValidationScalarsComeLast) {
  EpochStats with = stats_of_epoch(1, 4);
  with.val_loss = 0.5625;
  with.val_acc = 0.8125;
  with.eval_seconds = 0.25;
  const auto scalars = epoch_scalars(with);
  EXPECT_EQ(tags_of(scalars),
            (std::vector<std::string>{"epoch/train_loss", "epoch/train_acc", "epoch/test_loss",
                                      "epoch/test_acc", "epoch/seconds",
                                      "epoch/images_per_second", "epoch/wall_ms_per_step",
                                      "epoch/val_loss", "epoch/val_acc"}));
  EXPECT_EQ(scalars[7].value, 0.5625);
  EXPECT_EQ(scalars[8].value, 0.8125);
}

TEST(TensorBoardLog, SettingsAreAMarkdownTableWithBarsEscaped) {
  EXPECT_EQ(settings_markdown({{"--lr", "0.1"}, {"the start", "a|b\nc"}}),
            "| setting | value |\n|---|---|\n| --lr | 0.1 |\n| the start | a\\|b c |\n");
}

// Steps 4 per epoch: a fresh run marks its start at step 1, epochs land at their last step,
// the running loss where it was measured, and a --max-steps-cut epoch is left out.
TEST(TensorBoardLog, EverythingSitsAtItsGlobalStep) {
  TempDir dir;
  {
    TensorBoardLog log(dir.path(), 4);
    log.start(0, "| setting | value |\n");
    log.add_loss(LossStats{1, 3, 3, 2.25});
    log.add_epoch(stats_of_epoch(1, 4));
    log.add_loss(LossStats{2, 6, 3, 1.5});
    log.add_epoch(stats_of_epoch(2, 3));  // cut short: not recorded
  }
  const auto events = read_events(only_event_file(dir));
  ASSERT_EQ(events.size(), 6u);
  EXPECT_TRUE(events[1].session_start);
  EXPECT_EQ(events[1].step, 1);
  EXPECT_EQ(events[2].values[0].tag, "run/settings");
  EXPECT_EQ(events[2].step, 1);
  EXPECT_EQ(events[3].step, 3);
  EXPECT_EQ(events[3].values[0].tag, "step/train_loss");
  EXPECT_EQ(events[3].values[0].simple_value, 2.25f);
  EXPECT_EQ(events[4].step, 4);
  EXPECT_EQ(events[4].values.size(), 7u);
  EXPECT_EQ(events[4].values[3].tag, "epoch/test_acc");
  EXPECT_EQ(events[4].values[3].simple_value, 0.875f);
  EXPECT_EQ(events[5].step, 6);
}

// A run resumed after global step 10 marks its start at 11: TensorBoard then drops what the
// stopped run's file holds at 11 and after (Note [Resuming without a step twice]).
TEST(TensorBoardLog, AResumedRunStartsAfterItsCheckpointsStep) {
  TempDir dir;
  { TensorBoardLog(dir.path(), 4).start(10, ""); }
  const auto events = read_events(only_event_file(dir));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_TRUE(events[1].session_start);
  EXPECT_EQ(events[1].step, 11);
}

// ---- The directory ---------------------------------------------------------------------------

TEST(TensorBoardDir, IsMadeWhenMissingAndLeftEmpty) {
  TempDir dir;
  const std::string nested = dir.file("runs/a");
  prepare_tensorboard_dir(nested);
  EXPECT_TRUE(testing::path_exists(nested));
  EXPECT_TRUE(testing::list_directory(nested).empty());  // the trial file is gone
  prepare_tensorboard_dir(nested);                      // an existing directory is fine
}

TEST(TensorBoardDir, AFileOrAnUnwritablePlaceIsAUsageErrorNamingIt) {
  TempDir dir;
  testing::write_bytes(dir.file("f"), {1});
  testing::expect_throws<UsageError>([&] { prepare_tensorboard_dir(dir.file("f")); },
                                     {"--tensorboard " + dir.file("f"), "is a regular file",
                                      "not a directory"});
  testing::expect_throws<UsageError>([&] { prepare_tensorboard_dir(dir.file("f/sub")); },
                                     {"--tensorboard " + dir.file("f/sub"), "cannot create"});
  // procfs takes no new file, not even from root.
  testing::expect_throws<UsageError>([&] { prepare_tensorboard_dir("/proc"); },
                                     {"--tensorboard /proc: cannot create a file there"});
}

// ---- One folder per run ----------------------------------------------------------------------

// Note [One folder per run]: fresh runs are run-1, run-2, ... in the order they start; a resume
// continues the newest run recorded with its checkpoint directory (however that is spelled),
// and starts a new run where none was.
TEST(TensorBoardRuns, FreshRunsAreNumberedAndAResumeContinuesItsCheckpointDirectorysRun) {
  TempDir dir;
  const std::string tb = dir.file("tb");
  prepare_tensorboard_dir(tb);
  for (const char* ck : {"ck1", "ck2", "ck3"}) prepare_tensorboard_dir(dir.file(ck));
  ASSERT_EQ(::symlink(dir.file("ck1").c_str(), dir.file("ck1-link").c_str()), 0);
  const auto fresh = [&](const std::optional<std::string>& ck) {
    return tensorboard_run_folder(tb, ck, /*resumed=*/false);
  };
  const auto resumed = [&](const std::optional<std::string>& ck) {
    return tensorboard_run_folder(tb, ck, /*resumed=*/true);
  };
  EXPECT_EQ(fresh(dir.file("ck1")), tb + "/run-1");
  EXPECT_EQ(testing::read_text(tb + "/run-1/.dptrain-checkpoint-dir"),
            file_identity(dir.file("ck1")).real_path);
  EXPECT_EQ(fresh(std::nullopt), tb + "/run-2");  // no checkpoints: nothing to record
  EXPECT_EQ(testing::list_directory(tb + "/run-2"), std::vector<std::string>{});
  EXPECT_EQ(fresh(dir.file("ck2")), tb + "/run-3");
  EXPECT_EQ(resumed(dir.file("ck1-link/")), tb + "/run-1");
  EXPECT_EQ(resumed(dir.file("ck2")), tb + "/run-3");
  EXPECT_EQ(resumed(dir.file("ck3")), tb + "/run-4");  // none recorded: a new run
  EXPECT_EQ(resumed(dir.file("ck3")), tb + "/run-4");  // ... which its next resume continues
  EXPECT_EQ(resumed(std::nullopt), tb + "/run-5");
  EXPECT_EQ(fresh(dir.file("ck1")), tb + "/run-6");    // --fresh in ck1: a new line of runs
  EXPECT_EQ(resumed(dir.file("ck1")), tb + "/run-6");  // ... the one ck1 now holds
  // Only run-N names count (N without a leading zero); a file of such a name is passed over.
  for (const char* other : {"run-07", "run-x", "runs", "run-", "run-1000000000"}) {
    testing::write_bytes(tb + "/" + other, {1});
  }
  testing::write_bytes(tb + "/run-9", {1});
  EXPECT_EQ(fresh(std::nullopt), tb + "/run-10");
  EXPECT_EQ(resumed(dir.file("ck1")), tb + "/run-6");
}

// A run folder whose record is missing or foreign is not continued.
TEST(TensorBoardRuns, ARunWithoutItsRecordIsNotContinued) {
  TempDir dir;
  const std::string tb = dir.file("tb");
  prepare_tensorboard_dir(tb);
  prepare_tensorboard_dir(dir.file("ck"));
  EXPECT_EQ(tensorboard_run_folder(tb, dir.file("ck"), false), tb + "/run-1");
  ASSERT_EQ(::unlink((tb + "/run-1/.dptrain-checkpoint-dir").c_str()), 0);
  EXPECT_EQ(tensorboard_run_folder(tb, dir.file("ck"), true), tb + "/run-2");
  testing::write_bytes(tb + "/run-2/.dptrain-checkpoint-dir", {'/', 'x'});
  EXPECT_EQ(tensorboard_run_folder(tb, dir.file("ck"), true), tb + "/run-3");
  testing::expect_data_error([&] { tensorboard_run_folder(dir.file("none"), std::nullopt, false); },
                             {"--tensorboard " + dir.file("none"), "cannot list"});
}

TEST(TensorBoardSupport, ThisBuildHasIt) {
  EXPECT_TRUE(tensorboard_supported());
  require_tensorboard_support();
}

#else  // a build without protobuf or ISA-L

TEST(TensorBoardSupport, TheFlagIsRefusedNamingWhatTheBuildLacked) {
  EXPECT_FALSE(tensorboard_supported());
  testing::expect_throws<UsageError>([] { require_tensorboard_support(); },
                                     {"--tensorboard: this dptrain was built without",
                                      "libisal-dev"});
  TempDir dir;
  testing::expect_throws<UsageError>([&] { TensorBoardWriter writer(dir.path()); },
                                     {"built without"});
}

#endif

}  // namespace
}  // namespace dptrain
