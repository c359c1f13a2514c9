// Tests of download.h against a local `python3 -m http.server` on loopback and file:// URLs,
// serving small files with overridden checksums; one test checks the built-in checksums on the
// real files rebuilt from Debian's copies. Nothing here reaches the internet.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dptrain/data.h"
#include "dptrain/download.h"
#include "dptrain/errors.h"
#include "dptrain/sha256.h"
#include "test_support.h"

namespace dptrain {
namespace {

using testing::path_exists;
using testing::TempDir;

// ---- Helpers ---------------------------------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
  testing::write_bytes(path, std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

// Whether something accepts TCP connections on 127.0.0.1:port.
bool port_accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return ok;
}

// `python3 -m http.server` serving `directory` on loopback for the life of the object.
class HttpServer {
 public:
  HttpServer(const std::string& directory, const std::string& log_prefix)
      : port_(testing::free_port()) {
    child_ = testing::spawn_command({"python3", "-m", "http.server", "--bind", "127.0.0.1",
                                     std::to_string(port_), "--directory", directory},
                                    {}, log_prefix);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!port_accepts(port_)) {
      if (std::chrono::steady_clock::now() > deadline) {
        stop();
        throw std::runtime_error("python3 -m http.server did not start; see " + log_prefix +
                                 ".err");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~HttpServer() { stop(); }
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }

 private:
  void stop() {
    if (child_.pid <= 0) return;
    ::kill(-child_.pid, SIGTERM);
    testing::wait_command(child_, 10);
    child_.pid = -1;
  }

  int port_;
  testing::ChildProcess child_;
};

// A socket on loopback that listens but never answers: the kernel completes the handshake, so
// a client connects and then waits for a response that never comes.
class SilentServer {
 public:
  SilentServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      throw std::runtime_error("cannot listen on loopback");
    }
    port_ = ntohs(address.sin_port);
  }
  ~SilentServer() { ::close(fd_); }
  SilentServer(const SilentServer&) = delete;
  SilentServer& operator=(const SilentServer&) = delete;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

const std::vector<std::string> kNames = {kTrainImagesFile, kTrainLabelsFile, kTestImagesFile,
                                         kTestLabelsFile};

// Four small stand-ins for the real files, one of them over a 64 KiB libcurl buffer, and
// options that expect exactly them, try twice and barely wait.
class DownloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!download_supported()) GTEST_SKIP() << "this build of dptrain has no libcurl";
  }

  DownloadTest() {
    for (size_t i = 0; i < kNames.size(); ++i) {
      std::string bytes = "fake " + kNames[i] + "\n";
      const size_t extra = i == 0 ? 200000 : 100 * i;
      for (size_t k = 0; k < extra; ++k) bytes.push_back(static_cast<char>((k * 131 + i) % 251));
      contents_[kNames[i]] = bytes;
      write_file(served_.file(kNames[i]), bytes);
      options_.expected_sha256[kNames[i]] = sha256_hex(bytes);
    }
    options_.directory = target_.path() + "/nested/data";
    options_.attempts = 2;
    options_.retry_backoff = std::chrono::milliseconds(10);
    options_.connect_timeout = std::chrono::seconds(5);
    options_.low_speed_timeout = std::chrono::seconds(5);
  }

  std::string target(const std::string& name) const { return options_.directory + "/" + name; }

  // No ".part" file and, unless listed in `present`, no target file.
  void expect_nothing_left_but(const std::vector<std::string>& present) const {
    for (const auto& name : kNames) {
      EXPECT_FALSE(path_exists(target(name) + ".part")) << name;
      const bool expected = std::find(present.begin(), present.end(), name) != present.end();
      EXPECT_EQ(path_exists(target(name)), expected) << name;
    }
  }

  void expect_all_present_and_identical() const {
    for (const auto& name : kNames) {
      EXPECT_EQ(read_file(target(name)), contents_.at(name)) << name;
      EXPECT_FALSE(path_exists(target(name) + ".part")) << name;
    }
  }

  TempDir served_, target_;
  std::map<std::string, std::string> contents_;
  DownloadOptions options_;
};

// ---- Success -------------------------------------------------------------------------------

class DownloadEachScheme : public DownloadTest,
                           public ::testing::WithParamInterface<std::string> {};

TEST_P(DownloadEachScheme, FetchesEveryFileByteForByte) {
  std::optional<HttpServer> server;
  if (GetParam() == "http") {
    // The server's log goes to another directory, so that it is not served as a file.
    server.emplace(served_.path(), target_.file("http-server"));
    options_.base_url = server->url();
  } else {
    options_.base_url = "file://" + served_.path();  // no trailing slash: one is added
  }
  std::vector<DownloadProgress> reports;
  const auto files =
      download_fashion_mnist(options_, [&](const DownloadProgress& p) { reports.push_back(p); });

  expect_all_present_and_identical();
  ASSERT_EQ(files.size(), kNames.size());
  for (const auto& file : files) {
    EXPECT_TRUE(file.fetched) << file.name;
    EXPECT_EQ(file.attempts, 1) << file.name;
    EXPECT_EQ(file.path, target(file.name));
    EXPECT_EQ(file.bytes, static_cast<int64_t>(contents_.at(file.name).size()));
    EXPECT_EQ(sha256_file_hex(file.path), options_.expected_sha256.at(file.name));
  }
  // Each file: at least one kReceiving report knowing the size, then kDone with the size.
  for (const auto& name : kNames) {
    const int64_t size = static_cast<int64_t>(contents_.at(name).size());
    bool received = false, done = false;
    for (const auto& report : reports) {
      if (report.file != name) continue;
      if (report.stage == DownloadStage::kReceiving) {
        EXPECT_FALSE(done) << name;
        EXPECT_GT(report.bytes_done, 0);
        EXPECT_LE(report.bytes_done, size);
        EXPECT_EQ(report.bytes_total, size) << name;
        received = true;
      }
      if (report.stage == DownloadStage::kDone) {
        EXPECT_EQ(report.bytes_done, size);
        done = true;
      }
      EXPECT_NE(report.stage, DownloadStage::kRetrying) << report.message;
    }
    EXPECT_TRUE(received) << name;
    EXPECT_TRUE(done) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(DownloadSchemes, DownloadEachScheme, ::testing::Values("http", "file"));

// ---- Files already there -------------------------------------------------------------------

TEST_F(DownloadTest, SkipsFilesAlreadyPresentWithoutTheNetwork) {
  testing::make_directories(options_.directory);
  for (const auto& name : kNames) write_file(target(name), contents_.at(name));
  options_.base_url = "http://127.0.0.1:" + std::to_string(testing::free_port()) + "/";

  int skipped = 0;
  const auto files = download_fashion_mnist(options_, [&](const DownloadProgress& p) {
    EXPECT_EQ(p.stage, DownloadStage::kSkipped) << p.file;
    ++skipped;
  });
  EXPECT_EQ(skipped, 4);
  for (const auto& file : files) {
    EXPECT_FALSE(file.fetched) << file.name;
    EXPECT_EQ(file.attempts, 0);
  }
  expect_all_present_and_identical();
}

TEST_F(DownloadTest, RefetchesAFileWithTheWrongChecksum) {
  testing::make_directories(options_.directory);
  for (const auto& name : kNames) write_file(target(name), contents_.at(name));
  write_file(target(kTestLabelsFile), "corrupted");
  options_.base_url = "file://" + served_.path() + "/";

  const auto files = download_fashion_mnist(options_);
  for (const auto& file : files) EXPECT_EQ(file.fetched, file.name == kTestLabelsFile);
  expect_all_present_and_identical();
}

TEST_F(DownloadTest, ForceRefetchesEvenCorrectFiles) {
  testing::make_directories(options_.directory);
  for (const auto& name : kNames) write_file(target(name), contents_.at(name));
  options_.base_url = "file://" + served_.path() + "/";
  options_.force = true;

  for (const auto& file : download_fashion_mnist(options_)) EXPECT_TRUE(file.fetched);
  expect_all_present_and_identical();
}

// ---- Failures ------------------------------------------------------------------------------

TEST_F(DownloadTest, Http404IsADataErrorNamingTheUrlAndLeavesNoFile) {
  testing::remove_path(served_.file(kTrainLabelsFile));
  HttpServer server(served_.path(), target_.file("http-server"));
  options_.base_url = server.url();
  // 404 cannot change on a retry, so the message has no "gave up after".
  testing::expect_data_error([&] { download_fashion_mnist(options_); },
                             {"download " + server.url() + kTrainLabelsFile + ": HTTP 404"});
  // The files before it in name order arrived; train-labels left nothing.
  expect_nothing_left_but({kTestImagesFile, kTestLabelsFile, kTrainImagesFile});
}

TEST_F(DownloadTest, ChecksumMismatchIsRetriedThenADataErrorAndLeavesNoFile) {
  HttpServer server(served_.path(), target_.file("http-server"));
  options_.base_url = server.url();
  const std::string wrong(64, '0');
  options_.expected_sha256[kTestImagesFile] = wrong;
  int retries = 0;
  testing::expect_data_error(
      [&] {
        download_fashion_mnist(options_, [&](const DownloadProgress& p) {
          if (p.stage == DownloadStage::kRetrying) ++retries;
        });
      },
      {server.url() + kTestImagesFile,
       "SHA-256 mismatch: got " + sha256_hex(contents_.at(kTestImagesFile)), "expected " + wrong,
       "gave up after 2 attempts"});
  EXPECT_EQ(retries, 1);
  expect_nothing_left_but({});  // t10k-images is first in name order
}

TEST_F(DownloadTest, ConnectionRefusedIsRetriedThenADataError) {
  options_.base_url = "http://127.0.0.1:" + std::to_string(testing::free_port());
  testing::expect_data_error(
      [&] { download_fashion_mnist(options_); },
      {options_.base_url + "/" + kTestImagesFile, "onnect", "gave up after 2 attempts"});
  expect_nothing_left_but({});
}

TEST_F(DownloadTest, ServerThatNeverAnswersTimesOut) {
  SilentServer server;
  options_.base_url = server.url();
  options_.attempts = 1;
  options_.low_speed_timeout = std::chrono::seconds(1);
  const auto start = std::chrono::steady_clock::now();
  testing::expect_data_error([&] { download_fashion_mnist(options_); },
                             {server.url() + kTestImagesFile, "too slow"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  expect_nothing_left_but({});
}

TEST_F(DownloadTest, MissingFileUrlIsADataError) {
  testing::remove_path(served_.file(kTestImagesFile));
  options_.base_url = "file://" + served_.path() + "/";
  testing::expect_data_error([&] { download_fashion_mnist(options_); },
                             {"download file://" + served_.file(kTestImagesFile) + ": "});
  expect_nothing_left_but({});
}

TEST_F(DownloadTest, UnsupportedSchemeIsAUsageError) {
  for (const std::string url : {"ftp://example.org/", "example.org/data", "", "gopher://x/"}) {
    options_.base_url = url;
    EXPECT_THROW(download_fashion_mnist(options_), UsageError) << url;
  }
  EXPECT_FALSE(path_exists(options_.directory));
}

TEST_F(DownloadTest, BadOptionsAreUsageErrors) {
  options_.base_url = "file://" + served_.path();
  DownloadOptions no_attempts = options_;
  no_attempts.attempts = 0;
  EXPECT_THROW(download_fashion_mnist(no_attempts), UsageError);
  DownloadOptions bad_digest = options_;
  bad_digest.expected_sha256[kTestLabelsFile] = "abc";
  EXPECT_THROW(download_fashion_mnist(bad_digest), UsageError);
  DownloadOptions no_directory = options_;
  no_directory.directory.clear();
  EXPECT_THROW(download_fashion_mnist(no_directory), UsageError);
}

TEST_F(DownloadTest, DirectoryThatCannotBeCreatedIsADataError) {
  write_file(target_.file("plain-file"), "not a directory");
  options_.directory = target_.file("plain-file") + "/data";
  options_.base_url = "file://" + served_.path();
  testing::expect_data_error([&] { download_fashion_mnist(options_); },
                             {"cannot create download directory " + options_.directory});
}

TEST_F(DownloadTest, ReadOnlyDirectoryIsADataError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root may write into a read-only directory";
  testing::make_directories(options_.directory);
  ASSERT_EQ(::chmod(options_.directory.c_str(), 0555), 0);
  options_.base_url = "file://" + served_.path();
  testing::expect_data_error(
      [&] { download_fashion_mnist(options_); },
      {"cannot write " + target(kTestImagesFile) + ".part", "Permission denied"});
  ::chmod(options_.directory.c_str(), 0755);
  expect_nothing_left_but({});
}

TEST_F(DownloadTest, ExceptionFromTheProgressCallbackAbortsAndLeavesNoFile) {
  options_.base_url = "file://" + served_.path();
  EXPECT_THROW(download_fashion_mnist(options_,
                                      [](const DownloadProgress& p) {
                                        if (p.stage == DownloadStage::kReceiving) {
                                          throw std::runtime_error("cancelled");
                                        }
                                      }),
               std::runtime_error);
  expect_nothing_left_but({});
}

// ---- The built-in checksums ------------------------------------------------------------------

// Debian's dataset-fashion-mnist holds the upstream deflate streams under re-written gzip
// headers (see Note [Where the checksums come from] in download.cpp). Putting the upstream
// header back must give files that pass the built-in checksums, fetched over file://.
TEST(DownloadRealData, RebuiltUpstreamFilesPassTheBuiltInChecksums) {
  if (!download_supported()) GTEST_SKIP() << "this build of dptrain has no libcurl";
  const std::string debian = "/usr/share/datasets/fashion-mnist";
  if (!testing::is_regular_file(debian + "/" + kTestLabelsFile)) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  TempDir served, target;
  for (const std::string& name : kNames) {
    const std::string debian_bytes = read_file(debian + "/" + name);
    ASSERT_GT(debian_bytes.size(), 10u);
    ASSERT_EQ(debian_bytes[3], 0) << name << ": expected Debian's header without a file name";
    const uint32_t mtime = name.rfind("train", 0) == 0 ? 1504176606u : 1504176627u;
    std::string upstream = "\x1f\x8b\x08\x08";  // gzip, deflate, FNAME
    for (int shift = 0; shift < 32; shift += 8)
      upstream.push_back(static_cast<char>(mtime >> shift));
    upstream += std::string("\x00\x03", 2);       // XFL 0, OS Unix
    upstream += name.substr(0, name.size() - 3);  // the name without ".gz"
    upstream.push_back('\0');
    upstream += debian_bytes.substr(10);
    write_file(served.file(name), upstream);
  }
  DownloadOptions options;
  options.base_url = "file://" + served.path() + "/";
  options.directory = target.path();
  options.attempts = 1;
  const auto files = download_fashion_mnist(options);
  ASSERT_EQ(files.size(), 4u);
  for (const auto& file : files) EXPECT_TRUE(file.fetched) << file.name;
}

}  // namespace
}  // namespace dptrain
