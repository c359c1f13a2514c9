// Tests of core/files.h's answers to "are these two paths one file?" (file_identity,
// check_distinct_files), of the lock a writer holds on each output (OutputLock), of the escaping of
// untrusted text in a message line, the probe before an output, and write_all.
// Not here: the reads, checks and atomic writes, which the checkpoint tests exercise
// (tests/train/test_checkpoint.cpp), and the binary's use of them (integration/test_hostile_outputs.cpp).
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>

#include <cerrno>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::expect_throws;
using testing::list_directory;
using testing::read_text;
using testing::TempDir;
using testing::write_bytes;

// ---- file_identity, same_file -------------------------------------------------------------

// A name still to be written is one file with every other spelling of it: through a link to
// its directory, through "..", with "./" in the way.
TEST(FileIdentity, SpellingsOfANewNameAreOneFile) {
  TempDir dir;
  testing::make_directories(dir.file("real/sub"));
  ASSERT_EQ(::symlink(dir.file("real").c_str(), dir.file("link").c_str()), 0);
  const auto plain = file_identity(dir.file("real/out.csv"));
  EXPECT_FALSE(plain.exists);
  for (const std::string& other : {dir.file("link/out.csv"), dir.file("real/sub/../out.csv"),
                                  dir.file("real/./out.csv"), dir.file("link/sub/../out.csv")}) {
    EXPECT_TRUE(same_file(plain, file_identity(other))) << other;
    EXPECT_EQ(file_identity(other).real_path, plain.real_path) << other;
  }
  EXPECT_FALSE(same_file(plain, file_identity(dir.file("real/out.csv2"))));
  EXPECT_FALSE(same_file(plain, file_identity(dir.file("real/sub/out.csv"))));
}

// A hard link has a name of its own and the inode of the other: one file.
TEST(FileIdentity, AHardLinkIsTheFileItNames) {
  TempDir dir;
  write_bytes(dir.file("a"), {1, 2, 3});
  ASSERT_EQ(::link(dir.file("a").c_str(), dir.file("b").c_str()), 0);
  const auto a = file_identity(dir.file("a"));
  const auto b = file_identity(dir.file("b"));
  EXPECT_TRUE(a.exists);
  EXPECT_NE(a.real_path, b.real_path);
  EXPECT_TRUE(same_file(a, b));
  write_bytes(dir.file("c"), {1, 2, 3});  // the same bytes, another file
  EXPECT_FALSE(same_file(a, file_identity(dir.file("c"))));
}

// An input that is a symbolic link is the file it leads to.
TEST(FileIdentity, ASymbolicLinkIsTheFileItLeadsTo) {
  TempDir dir;
  write_bytes(dir.file("target.safetensors"), {0});
  ASSERT_EQ(::symlink("target.safetensors", dir.file("data").c_str()), 0);
  EXPECT_TRUE(same_file(file_identity(dir.file("data")),
                        file_identity(dir.file("target.safetensors"))));
  EXPECT_EQ(file_identity(dir.file("data")).real_path,
            file_identity(dir.file("target.safetensors")).real_path);
}

// ---- check_distinct_files -----------------------------------------------------------------

TEST(CheckDistinctFiles, DistinctOutputsAndInputsPass) {
  TempDir dir;
  write_bytes(dir.file("in"), {0});
  EXPECT_NO_THROW(check_distinct_files({{"--metrics", dir.file("m.csv")},
                                        {"--plot", dir.file("p.svg")}},
                                       {{"--model", dir.file("in")}, {"--model", dir.file("in")}}));
}

// The message names both roles and the one path, made printable.
TEST(CheckDistinctFiles, TwoOutputsOfOneFileAreRefusedNamingBoth) {
  TempDir dir;
  testing::make_directories(dir.file("d"));
  ASSERT_EQ(::symlink(dir.file("d").c_str(), dir.file("l").c_str()), 0);
  const auto message = expect_throws<UsageError>(
      [&] {
        check_distinct_files({{"--metrics", dir.file("d/x")}, {"--tensorboard", dir.file("l/x")}},
                             {});
      },
      {"--metrics and --tensorboard name one file, ", "/d/x;", "give it another name"});
  EXPECT_EQ(message.find("/l/x"), std::string::npos) << message;
}

TEST(CheckDistinctFiles, AnOutputThatIsAnInputIsRefused) {
  TempDir dir;
  write_bytes(dir.file("train-labels-idx1-ubyte"), {0, 0, 8, 1});
  ASSERT_EQ(::link(dir.file("train-labels-idx1-ubyte").c_str(), dir.file("m.csv").c_str()), 0);
  expect_throws<UsageError>(
      [&] {
        check_distinct_files({{"--metrics", dir.file("m.csv")}},
                             {{"the data file x", dir.file("train-labels-idx1-ubyte")}});
      },
      {"--metrics and the data file x name one file", "never writes over a file it reads"});
  // A newline in the name reaches the message escaped: one line.
  const auto message = expect_throws<UsageError>(
      [&] {
        check_distinct_files({{"--logits", dir.file("a\nb")}}, {{"--model", dir.file("a\nb")}});
      },
      {"a\\x0ab"});
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

// ---- OutputLock ---------------------------------------------------------------------------

// Note [One writer per output]: the second writer is refused naming the first, the lock file
// says who holds it, and it is gone when the holder is done.
TEST(OutputLock, ASecondWriterIsRefusedNamingTheHolder) {
  TempDir dir;
  const std::string output = dir.file("m.csv");
  EXPECT_EQ(OutputLock::lock_path(output), dir.file(".m.csv.lock"));
  EXPECT_EQ(OutputLock::lock_path("m.csv"), ".m.csv.lock");
  {
    OutputLock first(output, "--metrics");
    const std::string holder = read_text(dir.file(".m.csv.lock"));
    EXPECT_EQ(holder.rfind("pid " + std::to_string(::getpid()) + " on ", 0), 0u) << holder;
    // flock belongs to the open file description: a second one in this process conflicts too.
    expect_throws<UsageError>([&] { OutputLock second(output, "--metrics"); },
                              {"--metrics " + output + " is being written by another dptrain run",
                               "(pid " + std::to_string(::getpid()) + " on ",
                               "give this run a file of its own"});
  }
  EXPECT_EQ(list_directory(dir.path()), std::vector<std::string>{});
  OutputLock again(output, "--metrics");  // free once the holder is done
}

// A directory output (--tensorboard DIR) is locked inside itself: every spelling of it (a
// trailing slash, a symbolic link, "..") meets the one lock, and the refusal names the holder.
TEST(OutputLock, ADirectoryIsLockedInsideItselfUnderEverySpelling) {
  TempDir dir;
  const std::string tb = dir.file("tb");
  ASSERT_EQ(::mkdir(tb.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(tb.c_str(), dir.file("link").c_str()), 0);
  EXPECT_EQ(OutputLock::directory_lock_path(tb), tb + "/.dptrain-writer.lock");
  {
    OutputLock first(tb, "--tensorboard", OutputKind::kDirectory);
    EXPECT_EQ(list_directory(tb), std::vector<std::string>{".dptrain-writer.lock"});
    for (const std::string& other : {tb + "/", dir.file("link"), tb + "/../tb"}) {
      expect_throws<UsageError>(
          [&] { OutputLock second(other, "--tensorboard", OutputKind::kDirectory); },
          {"--tensorboard " + other + " is being written by another dptrain run",
           "(pid " + std::to_string(::getpid()) + " on ", "give this run a directory of its own"});
    }
  }
  EXPECT_EQ(list_directory(tb), std::vector<std::string>{});
  OutputLock again(tb + "/", "--tensorboard", OutputKind::kDirectory);
}

// A lock file left by a crash (a file, no flock) is taken over.
TEST(OutputLock, AStaleLockFileIsTakenOver) {
  TempDir dir;
  write_bytes(dir.file(".p.svg.lock"), {'p', 'i', 'd', ' ', '1', '\n'});
  {
    OutputLock lock(dir.file("p.svg"), "--plot");
    EXPECT_NE(read_text(dir.file(".p.svg.lock")).find(std::to_string(::getpid())),
              std::string::npos);
  }
  EXPECT_EQ(list_directory(dir.path()), std::vector<std::string>{});
}

// A hard link at the lock's name would have another file overwritten with the holder's line.
TEST(OutputLock, AHardLinkAtTheLockNameIsRefusedAndTheFileKept) {
  TempDir dir;
  write_bytes(dir.file("precious"), {'k', 'e', 'e', 'p'});
  ASSERT_EQ(::link(dir.file("precious").c_str(), dir.file(".m.csv.lock").c_str()), 0);
  testing::expect_data_error([&] { OutputLock lock(dir.file("m.csv"), "--metrics"); },
                             {"its lock file", "has 2 hard links", "remove it"});
  EXPECT_EQ(read_text(dir.file("precious")), "keep");
}

// Note [Untrusted text in messages]: a line keeps UTF-8 and backslashes and neutralises control
// bytes; text through printable first passes it unchanged.
TEST(MessageLine, ControlBytesAreEscapedAndEverythingElsePasses) {
  EXPECT_EQ(message_line("a\nb\x1b[2Jc\x7f donn\xc3\xa9" "es \\"),
            "a\\nb\\x1b[2Jc\\x7f donn\xc3\xa9" "es \\");
  EXPECT_EQ(message_line(std::string("\0\t", 2)), "\\x00\\x09");
  const std::string quoted = printable(std::string("\x1b]0;x\x07\n\xff\\", 7));
  EXPECT_EQ(message_line(quoted), quoted);
}

// The unique trial beside a path is created and removed; a place that takes no file says why.
TEST(TryCreateBeside, LeavesNothingAndNamesTheErrorWhereNothingCanBeCreated) {
  TempDir dir;
  std::string trial;
  EXPECT_EQ(try_create_beside(dir.file("out.csv"), &trial), 0);
  EXPECT_EQ(trial.rfind(dir.file("out.csv") + ".", 0), 0u) << trial;
  EXPECT_EQ(list_directory(dir.path()), std::vector<std::string>{});
  EXPECT_EQ(try_create_beside(dir.file("missing/out.csv")), ENOENT);
}

// write_all writes everything, and says why it could not.
TEST(WriteAll, WritesEveryByteOrReturnsTheError) {
  TempDir dir;
  const std::string path = dir.file("w");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  const std::string text(1 << 20, 'x');
  EXPECT_EQ(write_all(fd, text.data(), text.size()), 0);
  ::close(fd);
  EXPECT_EQ(read_text(path), text);
  EXPECT_EQ(write_all(-1, text.data(), 1), EBADF);
}

}  // namespace
}  // namespace dptrain
