// Tests of checkpoint_directory.h: the trial checkpoint temporary that
// prepare_checkpoint_directory makes, and the outputs it refuses to share with the directory.
// Not here: the directory's older tests (creation, the lock, --fresh, the search for the newest
// checkpoint), which live in test_checkpoint.cpp beside the format's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/train/checkpoint_directory.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::expect_data_error;
using testing::expect_throws;
using testing::list_directory;
using testing::TempDir;
using testing::write_bytes;

// A directory whose own path fits PATH_MAX but whose checkpoints' temporaries would not: made
// a component at a time, relative to the one before (mkdir takes no longer path).
std::string nearly_path_max_directory(const TempDir& dir, size_t length) {
  std::string path = dir.path();
  const std::string cwd = testing::current_directory();
  testing::change_directory(dir.path());
  while (path.size() + 1 < length) {
    const size_t part = std::min<size_t>(200, length - path.size() - 1);
    const std::string name(part, 'd');
    EXPECT_EQ(::mkdir(name.c_str(), 0755), 0);
    EXPECT_EQ(::chdir(name.c_str()), 0);
    path += "/" + name;
  }
  testing::change_directory(cwd);
  return path;
}

// A checkpoint's temporary longer than PATH_MAX would fail only after the training; the trial
// temporary fails first, naming its length, and leaves nothing.
TEST(PrepareCheckpointDirectory, APathTooLongForItsTemporariesIsRefusedNow) {
  TempDir dir;
  const std::string deep = nearly_path_max_directory(dir, PATH_MAX - 40);
  ASSERT_EQ(deep.size(), static_cast<size_t>(PATH_MAX - 40));
  expect_data_error([&] { prepare_checkpoint_directory(deep); },
                    {"checkpoint directory " + deep + ": cannot create a checkpoint there (",
                     "-byte trial path ", "checkpoint-e2147483647-s2147483647.safetensors.",
                     std::string("File name too long")});
  EXPECT_EQ(list_directory(deep), std::vector<std::string>{});
  // Room for the widest name is enough, and the trial is gone.
  TempDir other;
  const std::string fits = nearly_path_max_directory(other, PATH_MAX - 200);
  EXPECT_NO_THROW(prepare_checkpoint_directory(fits));
  EXPECT_EQ(list_directory(fits), std::vector<std::string>{});
}

// sysfs takes no new file, yet access() says yes to root: the trial says no. (Another user is
// refused by access() already, "not writable".)
TEST(PrepareCheckpointDirectory, APseudoFileSystemIsRefusedNow) {
  if (::access("/sys/kernel", F_OK) != 0) GTEST_SKIP() << "no /sys/kernel here";
  expect_data_error([&] { prepare_checkpoint_directory("/sys/kernel"); },
                    {"checkpoint directory /sys/kernel",
                     ::geteuid() == 0 ? "cannot create a checkpoint there" : "not writable"});
}

// --save-model (or --metrics, ...) onto the directory's lock file would break the lock, onto a
// checkpoint name replace it, and a hard link to a checkpoint have it truncated.
TEST(CheckOutputsApartFromCheckpoints, TheDirectorysOwnFilesAreRefused) {
  TempDir dir;
  const std::string ck = dir.file("ck");
  prepare_checkpoint_directory(ck);
  const auto refused = [&](const std::string& output, const std::string& role) {
    expect_throws<UsageError>(
        [&] { check_outputs_apart_from_checkpoints(ck, {{"--save-model", output}}); },
        {"--save-model and " + role + " name one file, ", "give it another name"});
  };
  refused(ck + "/.dptrain.lock", "--checkpoint-dir's lock file");  // there or not
  refused(dir.file("ck/../ck/checkpoint-e0007-s000000.safetensors"),
          "--checkpoint-dir's checkpoints");  // a name the run may write later
  refused(ck + "/checkpoint-e0001-s000000.dpt.123-0.tmp", "--checkpoint-dir's checkpoints");
  write_bytes(ck + "/checkpoint-e0001-s000000.safetensors", {1});
  ASSERT_EQ(::link((ck + "/checkpoint-e0001-s000000.safetensors").c_str(),
                   dir.file("m.csv").c_str()),
            0);
  refused(dir.file("m.csv"), "--checkpoint-dir's checkpoint");  // by its inode
  // Other names in the directory, and beside it, are the user's.
  EXPECT_NO_THROW(check_outputs_apart_from_checkpoints(
      ck, {{"--save-model", ck + "/model.safetensors"},
           {"--metrics", dir.file("checkpoint-e0001-s000000.safetensors")}}));
}

}  // namespace
}  // namespace dptrain
