// Tests of download.h against a local `python3 -m http.server` on loopback and file:// URLs,
// serving small files with overridden checksums; one test checks the built-in checksums on the
// real files rebuilt from Debian's copies. Nothing here reaches the internet.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/core/sha256.h"
#include "dptrain/data/data.h"
#include "download.h"
#include "support/test_support.h"

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

// A socket listening on 127.0.0.1 at a port the kernel picked, written to `port`.
int listen_on_loopback(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(fd, 8) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw std::runtime_error("cannot listen on loopback");
  }
  *port = ntohs(address.sin_port);
  return fd;
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
    fd_ = listen_on_loopback(&port_);
  }
  ~SilentServer() { ::close(fd_); }
  SilentServer(const SilentServer&) = delete;
  SilentServer& operator=(const SilentServer&) = delete;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// An HTTP server on loopback, in a thread of the test: it takes one connection after another
// until destroyed, reads the request and hands the connection to `respond`, which must return
// soon after `stopping` turns true.
class LoopbackHttpServer {
 public:
  using Respond = std::function<void(int client, const std::atomic<bool>& stopping)>;

  explicit LoopbackHttpServer(Respond respond) {
    fd_ = listen_on_loopback(&port_);
    thread_ = std::thread([this, respond = std::move(respond)] { serve(respond); });
  }
  ~LoopbackHttpServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  LoopbackHttpServer(const LoopbackHttpServer&) = delete;
  LoopbackHttpServer& operator=(const LoopbackHttpServer&) = delete;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }
  int connections() const { return connections_; }

  // Waits up to 100 ms for `fd` to be ready for `events`.
  static bool ready(int fd, short events) {
    pollfd entry{fd, events, 0};
    return ::poll(&entry, 1, 100) == 1;
  }

 private:
  void serve(const Respond& respond) {
    while (!stop_) {
      if (!ready(fd_, POLLIN)) continue;
      const int client = ::accept(fd_, nullptr, nullptr);
      if (client < 0) continue;
      ++connections_;
      char request[4096];
      if (ready(client, POLLIN)) (void)!::read(client, request, sizeof request);
      respond(client, stop_);
      ::close(client);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

// A mirror that drips: it announces a 4 MB file (under t10k-images' cap) and sends it
// `bytes_per_second` at a time, one piece every 100 ms.
class DripServer : public LoopbackHttpServer {
 public:
  explicit DripServer(int64_t bytes_per_second)
      : LoopbackHttpServer([piece = std::string(static_cast<size_t>(bytes_per_second / 10), 'x')](
                               int client, const std::atomic<bool>& stopping) {
          const std::string header =
              "HTTP/1.1 200 OK\r\nContent-Length: 4000000\r\nContent-Type: "
              "application/octet-stream\r\n\r\n";
          bool open = ::send(client, header.data(), header.size(), MSG_NOSIGNAL) > 0;
          while (open && !stopping) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            open = ::send(client, piece.data(), piece.size(), MSG_NOSIGNAL) > 0;
          }
        }) {}
};

// A mirror that floods: 200, then bytes as fast as the client takes them, for ever. `chunked`
// sends them as endless chunks without a Content-Length; otherwise it announces 10^12 bytes.
class FloodServer : public LoopbackHttpServer {
 public:
  explicit FloodServer(bool chunked)
      : LoopbackHttpServer([chunked](int client, const std::atomic<bool>& stopping) {
          const std::string header = std::string("HTTP/1.1 200 OK\r\n") +
                                     (chunked ? "Transfer-Encoding: chunked\r\n"
                                              : "Content-Length: 1000000000000\r\n") +
                                     "Content-Type: application/octet-stream\r\n\r\n";
          const std::string bytes(65536, 'x');
          const std::string piece = chunked ? "10000\r\n" + bytes + "\r\n" : bytes;  // 0x10000
          bool open = ::send(client, header.data(), header.size(), MSG_NOSIGNAL) > 0;
          // Polled, so that a client that stops reading cannot keep the destructor waiting;
          // each piece goes whole (a short send resumes where it stopped), or the chunks would
          // not parse.
          for (size_t done = 0; open && !stopping; done %= piece.size()) {
            if (!ready(client, POLLOUT)) continue;
            const ssize_t sent = ::send(client, piece.data() + done, piece.size() - done,
                                        MSG_NOSIGNAL | MSG_DONTWAIT);
            if (sent > 0) done += static_cast<size_t>(sent);
            open = sent > 0 || (sent < 0 && (errno == EAGAIN || errno == EINTR));
          }
        }) {}
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
      options_.max_bytes[kNames[i]] = static_cast<int64_t>(bytes.size());  // published size
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

// A mirror that drips 2 KB/s was never given up on: the low-speed limit was 1 KiB/s and there
// was no deadline. The defaults now catch it.
TEST(DownloadDefaults, CatchADripAndEndByADeadline) {
  const DownloadOptions defaults;
  EXPECT_EQ(defaults.low_speed_bytes_per_second, 10240);
  EXPECT_EQ(defaults.low_speed_timeout, std::chrono::seconds(30));
  EXPECT_EQ(defaults.deadline, std::chrono::minutes(30));
}

TEST_F(DownloadTest, DripBelowTheSpeedLimitIsAbandoned) {
  DripServer server(2048);
  options_.base_url = server.url();
  options_.max_bytes = fashion_mnist_sizes();  // the drip announces 4 MB
  options_.attempts = 1;
  options_.low_speed_bytes_per_second = 4096;
  options_.low_speed_timeout = std::chrono::seconds(1);
  const auto start = std::chrono::steady_clock::now();
  testing::expect_data_error([&] { download_fashion_mnist(options_); },
                             {server.url() + kTestImagesFile, "too slow", "Less than 4096"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  expect_nothing_left_but({});
}

// Above the speed limit, the deadline ends it, and is not retried.
TEST_F(DownloadTest, DeadlineEndsADripAboveTheSpeedLimitWithoutRetrying) {
  DripServer server(20000);
  options_.base_url = server.url();
  options_.max_bytes = fashion_mnist_sizes();  // the drip announces 4 MB
  options_.attempts = 3;
  options_.low_speed_bytes_per_second = 1000;
  options_.deadline = std::chrono::seconds(2);
  const auto start = std::chrono::steady_clock::now();
  testing::expect_data_error(
      [&] { download_fashion_mnist(options_); },
      {server.url() + kTestImagesFile, ": the download's deadline of 2 s passed"});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(1900));
  EXPECT_LT(took, std::chrono::seconds(8));
  EXPECT_EQ(server.connections(), 1);
  expect_nothing_left_but({});
}

// A stop request (what SIGINT and SIGTERM set) abandons the transfer within about a second and
// removes the ".part" file, even while nothing arrives.
TEST_F(DownloadTest, StopRequestEndsTheTransferAndRemovesThePartFile) {
  SilentServer server;
  options_.base_url = server.url();
  std::atomic<int> stop{0};
  options_.stop_signal = &stop;
  std::thread stopper([&] {
    for (int i = 0; i < 200 && !path_exists(target(kTestImagesFile) + ".part"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    stop = SIGTERM;
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    download_fashion_mnist(options_);
    ADD_FAILURE() << "the download did not stop";
  } catch (const DownloadStopped& stopped) {
    EXPECT_EQ(stopped.signal_number(), SIGTERM);
  }
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
  expect_nothing_left_but({});
}

// ---- Waits that end (Note [No wait without a bound] in download.cpp) ------------------------

// The inode of `path`, 0 when it is missing.
ino_t inode_of(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0 ? info.st_ino : 0;
}

// Opens the FIFO `path` for writing, and so releases a reader blocked in open(), once `after`
// has passed, unless `cancel` is set first: keeps a test of the old code from hanging for ever.
std::thread release_fifo_reader(const std::string& path, std::chrono::milliseconds after,
                                const std::atomic<bool>& cancel) {
  return std::thread([path, after, &cancel] {
    const auto until = std::chrono::steady_clock::now() + after;
    while (!cancel && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (cancel) return;
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  });
}

// A FIFO at a file:// mirror blocked the download in open() for ever, past the deadline and
// deaf to stop requests, with its ".part" left. It is refused at once now, not retried.
TEST_F(DownloadTest, FifoAtAFileUrlIsRefusedAtOnceAndLeavesNothing) {
  const std::string fifo = served_.file(kTestImagesFile);  // the first file fetched
  testing::remove_path(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  options_.base_url = "file://" + served_.path();
  options_.attempts = 3;
  options_.deadline = std::chrono::seconds(5);
  std::atomic<bool> done{false};
  std::thread rescue = release_fifo_reader(fifo, std::chrono::seconds(6), done);
  const auto start = std::chrono::steady_clock::now();
  const std::string message =
      testing::expect_throws<DataError>([&] { download_fashion_mnist(options_); }, {});
  const auto took = std::chrono::steady_clock::now() - start;
  done = true;
  rescue.join();
  EXPECT_EQ(message, "download file://" + fifo + ": " + fifo +
                         " is a FIFO, not a regular file; a file:// mirror must hold the files "
                         "themselves");
  EXPECT_LT(took, std::chrono::seconds(1));
  EXPECT_EQ(testing::list_directory(options_.directory), std::vector<std::string>{});
}

// A file at a target name was hashed whole before anything else: a sparse 20 GiB file took
// 71 s. A file whose size is not the published one is not the file, and is not read.
TEST_F(DownloadTest, FileOfAnotherSizeAtATargetNameIsReplacedUnread) {
  testing::make_directories(options_.directory);
  const std::string sparse = target(kTestImagesFile);
  write_file(sparse, "");
  ASSERT_EQ(::truncate(sparse.c_str(), int64_t{20} << 30), 0);
  options_.base_url = "file://" + served_.path();
  const auto start = std::chrono::steady_clock::now();
  const auto files = download_fashion_mnist(options_);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  expect_all_present_and_identical();
  for (const auto& file : files) EXPECT_TRUE(file.fetched) << file.name;
}

// A file of the published size is hashed in pieces: a stop request ends that within a second,
// and the deadline too, even for a (sparse) 4 GiB file that takes seconds to hash. The stop comes
// once the hash has read its first 64 MiB (this process's bytes read), not after a guessed sleep.
class DownloadLongHash : public DownloadTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(DownloadLongHash, EndsOnAStopRequestOrTheDeadline) {
  testing::make_directories(options_.directory);
  const std::string sparse = target(kTestImagesFile);
  write_file(sparse, "");
  const int64_t size = int64_t{4} << 30;
  ASSERT_EQ(::truncate(sparse.c_str(), size), 0);
  options_.max_bytes[kTestImagesFile] = size;
  options_.base_url = "file://" + served_.path();
  std::atomic<int> stop{0};
  options_.stop_signal = &stop;
  options_.deadline = std::chrono::seconds(GetParam() == "deadline" ? 1 : 60);
  std::thread stopper;
  std::chrono::steady_clock::time_point stopped_at{};
  if (GetParam() == "stop") {
    const int64_t read_before = testing::bytes_read_by("self");
    ASSERT_GE(read_before, 0) << "no /proc/self/io to see the hash reading";
    stopper = std::thread([&, read_before] {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (testing::bytes_read_by("self") - read_before < (int64_t{64} << 20) &&
             std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      stopped_at = std::chrono::steady_clock::now();
      stop = SIGTERM;
    });
  }
  const auto start = std::chrono::steady_clock::now();
  if (GetParam() == "stop") {
    EXPECT_THROW(download_fashion_mnist(options_), DownloadStopped);
  } else {
    testing::expect_data_error(
        [&] { download_fashion_mnist(options_); },
        {"download: checking " + sparse + ": the download's deadline of 1 s passed"});
  }
  const auto ended_at = std::chrono::steady_clock::now();
  if (stopper.joinable()) stopper.join();
  if (GetParam() == "stop") {
    EXPECT_LT(ended_at - stopped_at, std::chrono::seconds(1));
  } else {
    EXPECT_LT(ended_at - start, std::chrono::seconds(2));
  }
  EXPECT_EQ(testing::file_size(sparse), size);  // untouched
  EXPECT_EQ(testing::list_directory(options_.directory), std::vector<std::string>{kTestImagesFile});
}

INSTANTIATE_TEST_SUITE_P(, DownloadLongHash, ::testing::Values("stop", "deadline"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---- Response headers that libcurl will not take ---------------------------------------------

// A mirror whose response headers are too large: one line of 200 KB, or 2000 lines of 100
// bytes, and what the error says after the URL.
struct LargeHeader {
  std::string label;
  std::string headers;
  std::string says;
};

std::ostream& operator<<(std::ostream& out, const LargeHeader& c) { return out << c.label; }

class DownloadLargeHeader : public DownloadTest,
                            public ::testing::WithParamInterface<LargeHeader> {};

// libcurl's "Out of memory" (retried) was all one read for a header line over its limit. One
// line now names what was too large, and the mirror is not asked again.
TEST_P(DownloadLargeHeader, IsOneLineNamingTheLimitAndNotRetried) {
  LoopbackHttpServer server([headers = GetParam().headers](int client,
                                                           const std::atomic<bool>& stopping) {
    const std::string response = "HTTP/1.1 200 OK\r\n" + headers + "Content-Length: 5\r\n\r\nhello";
    for (size_t done = 0; done < response.size() && !stopping;) {
      if (!LoopbackHttpServer::ready(client, POLLOUT)) continue;
      const ssize_t sent = ::send(client, response.data() + done, response.size() - done,
                                  MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0 && errno != EAGAIN && errno != EINTR) break;
      if (sent > 0) done += static_cast<size_t>(sent);
    }
  });
  options_.base_url = server.url();
  options_.attempts = 3;
  const std::string message =
      testing::expect_throws<DataError>([&] { download_fashion_mnist(options_); }, {});
  EXPECT_EQ(message, "download " + server.url() + kTestImagesFile + ": " + GetParam().says);
  EXPECT_EQ(server.connections(), 1);
  EXPECT_EQ(testing::list_directory(options_.directory), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(
    DownloadHeaders, DownloadLargeHeader,
    ::testing::Values(
        LargeHeader{"one_long_line", "X-Big: " + std::string(200000, 'a') + "\r\n",
                    "a response header line from the server is longer than libcurl's limit of "
                    "102400 bytes (libcurl says \"Out of memory\")"},
        LargeHeader{"many_lines",
                    [] {
                      std::string lines;
                      for (int i = 0; i < 2000; ++i) {
                        lines +=
                            "X-Line-" + std::to_string(i) + ": " + std::string(80, 'b') + "\r\n";
                      }
                      return lines;
                    }(),
                    "the server's response headers are longer than 102400 bytes in all"}),
    [](const ::testing::TestParamInfo<LargeHeader>& info) { return info.param.label; });

// ---- Two downloads into one directory ---------------------------------------------------------

// A second download into a directory removed the first one's live ".part", and the first to
// finish could rename the other's half-written file into place. The second is refused now,
// naming the first, and the first's ".part" is untouched; once the first has ended, the
// directory is free again and holds no lock file.
TEST_F(DownloadTest, SecondDownloadIntoOneDirectoryIsRefusedNamingTheFirst) {
  DripServer server(20000);
  DownloadOptions first = options_;
  first.base_url = server.url();
  first.max_bytes = fashion_mnist_sizes();  // the drip announces 4 MB
  std::atomic<int> stop{0};
  first.stop_signal = &stop;
  std::thread first_download([&] {
    try {
      download_fashion_mnist(first);
      ADD_FAILURE() << "the first download did not stop";
    } catch (const DownloadStopped&) {
    }
  });
  const std::string part = target(kTestImagesFile) + ".part";
  for (int i = 0; i < 400 && testing::file_size(part) <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const ino_t inode = inode_of(part);
  ASSERT_NE(inode, 0u);
  const int64_t size_before = testing::file_size(part);

  options_.base_url = "file://" + served_.path();  // would finish at once
  const std::string message = testing::expect_throws<UsageError>(
      [&] { download_fashion_mnist(options_); },
      {"download: " + options_.directory + " is in use by another dptrain download (pid " +
           std::to_string(::getpid()) + " on " + host_name() + ", since ",
       "); wait for it to end, or give this one a directory of its own"});
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(inode_of(part), inode);
  EXPECT_GT(testing::file_size(part), size_before);  // still being written
  EXPECT_FALSE(path_exists(target(kTestImagesFile)));

  stop = SIGTERM;
  first_download.join();
  EXPECT_EQ(testing::list_directory(options_.directory), std::vector<std::string>{});
  download_fashion_mnist(options_);
  expect_all_present_and_identical();
  EXPECT_EQ(testing::list_directory(options_.directory).size(), kNames.size());
}

// The lock file is written into: a hard link planted at its name would have the file behind it
// overwritten. It is refused, and both files keep their bytes.
TEST_F(DownloadTest, HardLinkAtTheLockFileNameIsRefused) {
  testing::make_directories(options_.directory);
  const std::string victim = target_.file("victim");
  write_file(victim, "keep me\n");
  const std::string lock = options_.directory + "/.dptrain-download.lock";
  ASSERT_EQ(::link(victim.c_str(), lock.c_str()), 0);
  options_.base_url = "file://" + served_.path();
  testing::expect_data_error(
      [&] { download_fashion_mnist(options_); },
      {"download: its lock file " + lock + " has 2 hard links (another name shares it); ",
       "remove it"});
  EXPECT_EQ(read_file(victim), "keep me\n");
  EXPECT_FALSE(path_exists(target(kTestImagesFile)));
}

// "http://user:secret@host/" was echoed in the errors. No message or progress line holds the
// credentials.
TEST(DownloadRedaction, CredentialsAreReplaced) {
  EXPECT_EQ(redact_url("http://user:secret@host:8080/path?q=1"), "http://***@host:8080/path?q=1");
  EXPECT_EQ(redact_url("https://token@host/"), "https://***@host/");
  EXPECT_EQ(redact_url("http://a:b@c@host/x@y"), "http://***@host/x@y");
  EXPECT_EQ(redact_url("user:secret@host/data"), "***@host/data");
  EXPECT_EQ(redact_url("http://host/a@b"), "http://host/a@b");
  EXPECT_EQ(redact_url("file:///tmp/x"), "file:///tmp/x");
}

TEST_F(DownloadTest, CredentialsNeverAppearInMessages) {
  const std::string port = std::to_string(testing::free_port());
  options_.base_url = "http://user:secret@127.0.0.1:" + port + "/";
  std::vector<std::string> lines;
  try {
    download_fashion_mnist(options_,
                           [&](const DownloadProgress& p) { lines.push_back(p.message); });
    ADD_FAILURE() << "nothing listens there";
  } catch (const DataError& e) {
    lines.push_back(e.what());
    EXPECT_EQ(std::string(e.what()).rfind("download http://***@127.0.0.1:" + port + "/", 0), 0u)
        << e.what();
  }
  options_.base_url = "ftp://user:secret@127.0.0.1/";
  try {
    download_fashion_mnist(options_);
  } catch (const UsageError& e) {
    lines.push_back(e.what());
  }
  ASSERT_GE(lines.size(), 3u);  // a retry, the failure, the scheme
  for (const auto& line : lines) {
    EXPECT_EQ(line.find("secret"), std::string::npos) << line;
    EXPECT_EQ(line.find("user"), std::string::npos) << line;
  }
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

// ---- What stands at the ".part" name ------------------------------------------------------

// A ".part" left by a run that was killed (this user's, with no other name) is replaced.
TEST_F(DownloadTest, LeftoverPartFileOfAKilledRunIsReplaced) {
  testing::make_directories(options_.directory);
  for (const auto& name : kNames) write_file(target(name) + ".part", "half a file");
  options_.base_url = "file://" + served_.path();
  download_fashion_mnist(options_);
  expect_all_present_and_identical();
}

// Something planted at the ".part" name: how it is made, and what the error says it is.
struct PlantedPart {
  std::string kind;
  std::string says;
};

std::ostream& operator<<(std::ostream& out, const PlantedPart& c) { return out << c.kind; }

class DownloadPlantedPart : public DownloadTest,
                            public ::testing::WithParamInterface<PlantedPart> {};

// A hard link at "<name>.part" to another file (~/.bashrc; as root /etc/passwd) had that file
// truncated and written: O_NOFOLLOW stops only symbolic links. Only a leftover ".part" of this
// user's is replaced now; anything else stops the download with one line naming the path, and
// what stood there, and the file behind it, keep their bytes.
TEST_P(DownloadPlantedPart, IsRefusedNamedAndLeftUntouched) {
  testing::make_directories(options_.directory);
  const std::string victim = target_.file("victim");
  const std::string victim_bytes = "export PATH=/usr/bin\n";
  write_file(victim, victim_bytes);
  const std::string part = target(kTestImagesFile) + ".part";  // the first file fetched
  const std::string& kind = GetParam().kind;
  int planted = 0;
  if (kind == "hard_link") planted = ::link(victim.c_str(), part.c_str());
  if (kind == "symbolic_link") planted = ::symlink(victim.c_str(), part.c_str());
  if (kind == "fifo") planted = ::mkfifo(part.c_str(), 0600);
  if (kind == "directory") planted = ::mkdir(part.c_str(), 0755);
  if (kind == "other_users_file") {
    if (::geteuid() != 0) GTEST_SKIP() << "only root can give a file to another user";
    write_file(part, victim_bytes);
    planted = ::chown(part.c_str(), 65534, 65534);
  }
  ASSERT_EQ(planted, 0) << kind << " at " << part;
  options_.base_url = "file://" + served_.path();
  const std::string message = testing::expect_throws<DataError>(
      [&] { download_fashion_mnist(options_); },
      {"cannot write " + part + ": " + GetParam().says, "; remove it"});
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(read_file(victim), victim_bytes);
  EXPECT_TRUE(path_exists(part));
  if (testing::is_regular_file(part)) {
    EXPECT_EQ(read_file(part), victim_bytes);
  }
  EXPECT_FALSE(path_exists(target(kTestImagesFile)));
}

INSTANTIATE_TEST_SUITE_P(
    DownloadPartName, DownloadPlantedPart,
    ::testing::Values(PlantedPart{"hard_link",
                                  "it has 2 hard links; dptrain does not write through a file "
                                  "shared with another name"},
                      PlantedPart{"symbolic_link", "it is a symbolic link"},
                      PlantedPart{"fifo", "it is a FIFO"},
                      PlantedPart{"directory", "it is a directory"},
                      PlantedPart{"other_users_file", "it belongs to user 65534"}),
    [](const ::testing::TestParamInfo<PlantedPart>& info) { return info.param.kind; });

// ---- A mirror that sends too much -----------------------------------------------------------

TEST(DownloadDefaults, CapEachFileAtItsPublishedSize) {
  const DownloadOptions defaults;
  EXPECT_EQ(defaults.max_bytes, fashion_mnist_sizes());
  EXPECT_EQ(defaults.default_max_bytes, 64 << 20);
  ASSERT_EQ(defaults.max_bytes.size(), defaults.expected_sha256.size());
  for (const auto& [name, digest] : defaults.expected_sha256) {
    EXPECT_EQ(defaults.max_bytes.count(name), 1u) << name;
  }
}

// A flooding mirror: whether it sends chunks without end (else a Content-Length of 10^12), the
// file asked for, its cap, and how the error ends.
struct Flood {
  std::string label;
  bool chunked;
  std::string file;
  int64_t cap;
  std::string says;
};

std::ostream& operator<<(std::ostream& out, const Flood& c) { return out << c.label; }

class DownloadFlood : public DownloadTest, public ::testing::WithParamInterface<Flood> {};

// A mirror that floods was written to until the disk was full, and retried twice. Each file has
// a known maximum size now: a larger Content-Length is refused before a byte is written, a body
// that grows past it is stopped there; not retried, and no ".part" is left.
TEST_P(DownloadFlood, IsRefusedAtTheCapAtOnce) {
  const Flood& flood = GetParam();
  FloodServer server(flood.chunked);
  options_.base_url = server.url();
  options_.attempts = 3;
  options_.expected_sha256 = {{flood.file, std::string(64, '0')}};
  options_.max_bytes = fashion_mnist_sizes();  // the real caps
  options_.default_max_bytes = 1 << 20;  // for a file of unknown size only
  // The largest file the download directory ever holds, sampled while the download runs; not
  // the directory's lock file, which holds the line naming its holder.
  std::atomic<bool> done{false};
  std::atomic<int64_t> largest{0};
  std::thread watcher([&] {
    while (!done) {
      for (const auto& name : testing::list_directory(options_.directory)) {
        if (name == ".dptrain-download.lock") continue;
        const int64_t size = testing::file_size(options_.directory + "/" + name);
        if (size > largest) largest = size;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string message =
      testing::expect_throws<DataError>([&] { download_fashion_mnist(options_); }, {});
  const auto took = std::chrono::steady_clock::now() - start;
  done = true;
  watcher.join();
  EXPECT_EQ(message, "download " + server.url() + flood.file + ": the server sent more than the " +
                         std::to_string(flood.cap) + " bytes " + flood.file + " has " +
                         flood.says);
  EXPECT_LT(took, std::chrono::seconds(10));
  EXPECT_EQ(server.connections(), 1);
  EXPECT_LE(largest.load(), flood.cap);
  if (!flood.chunked) {
    EXPECT_EQ(largest.load(), 0);
  }
  EXPECT_EQ(testing::list_directory(options_.directory), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(
    DownloadFloods, DownloadFlood,
    ::testing::Values(Flood{"endless_chunks", true, kTestImagesFile, 4422102,
                            "(more than 4422102 bytes arrived)"},
                      Flood{"huge_content_length", false, kTrainImagesFile, 26421880,
                            "(Content-Length 1000000000000)"},
                      Flood{"endless_chunks_of_a_file_of_unknown_size", true, "extra.bin",
                            1 << 20, "(more than 1048576 bytes arrived)"}),
    [](const ::testing::TestParamInfo<Flood>& info) { return info.param.label; });

// ---- The dptrain download command --------------------------------------------------------------

std::vector<std::string> download_command(const std::string& url, const std::string& directory) {
  return {testing::dptrain_binary(), "download", "--url", url, "--data-dir", directory};
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    lines.push_back(text.substr(begin, end - begin));
  }
  if (begin < text.size()) lines.push_back(text.substr(begin));
  return lines;
}

// SIGTERM or SIGINT during a download left a ".part" file. The transfer is abandoned, the file
// removed, one line says so, and the exit status is 128 + the signal.
class CliDownloadSignal : public ::testing::TestWithParam<int> {};

TEST_P(CliDownloadSignal, RemovesThePartFileAndExitsWith128PlusTheSignal) {
  if (!download_supported()) GTEST_SKIP() << "this build of dptrain has no libcurl";
  DripServer server(2048);
  TempDir dir;
  const std::string part = dir.file(std::string(kTestImagesFile) + ".part");
  const auto child =
      testing::spawn_command(download_command(server.url(), dir.path()), {}, dir.file("run"));
  for (int i = 0; i < 400 && !path_exists(part); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_TRUE(path_exists(part));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // bytes are arriving
  ASSERT_EQ(::kill(child.pid, GetParam()), 0);
  const auto result = testing::wait_command(child, 15);
  EXPECT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 128 + GetParam()) << result.err;
  EXPECT_EQ(lines_of(result.err),
            (std::vector<std::string>{"dptrain: download stopped by signal " +
                                      std::to_string(GetParam()) + "; no partial file is left"}))
      << result.err;
  EXPECT_EQ(testing::list_directory(dir.path()), (std::vector<std::string>{"run.err", "run.out"}));
}

INSTANTIATE_TEST_SUITE_P(, CliDownloadSignal, ::testing::Values(SIGINT, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == SIGINT ? "Sigint" : "Sigterm";
                         });

// The limits are flags: a drip at 2 KB/s under --speed-limit 4096 --speed-time 1, retried until
// --max-time 4 passes, fails in seconds with one line that names the URL, without the password.
TEST(CliDownload, SpeedLimitAndMaxTimeFlagsEndADrip) {
  if (!download_supported()) GTEST_SKIP() << "this build of dptrain has no libcurl";
  DripServer server(2048);
  TempDir dir;
  const std::string url = "http://user:secret@" + server.url().substr(7);
  auto command = download_command(url, dir.path());
  command.insert(command.end(), {"--speed-limit", "4096", "--speed-time", "1", "--max-time", "4"});
  const auto start = std::chrono::steady_clock::now();
  const auto result = testing::run_command(command, {}, 60);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_GE(took, std::chrono::seconds(1));
  EXPECT_LT(took, std::chrono::seconds(15));
  const auto lines = lines_of(result.err);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().rfind("error: download http://***@127.0.0.1:", 0), 0u) << result.err;
  EXPECT_EQ(result.err.find("secret"), std::string::npos) << result.err;
  EXPECT_GE(server.connections(), 2) << result.err;  // retried before the deadline
  EXPECT_EQ(testing::list_directory(dir.path()), std::vector<std::string>{});
}

// A FIFO at a file:// mirror held `dptrain download --max-time 3` in open() until it was
// killed, and a SIGTERM did not end it. One error line now, at once, and nothing left. (The
// bound leaves room for a sanitized binary's start; the old one waited until the FIFO was
// opened for writing, here after 10 s.)
TEST(CliDownload, FifoAtAFileUrlEndsAtOnceWithOneErrorLine) {
  if (!download_supported()) GTEST_SKIP() << "this build of dptrain has no libcurl";
  TempDir served, dir;
  const std::string fifo = served.file(kTestImagesFile);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto command = download_command("file://" + served.path(), dir.file("data"));
  command.insert(command.end(), {"--max-time", "30"});
  std::atomic<bool> done{false};
  std::thread rescue = release_fifo_reader(fifo, std::chrono::seconds(10), done);
  const auto start = std::chrono::steady_clock::now();
  const auto result = testing::run_command(command, {}, 20);
  const auto took = std::chrono::steady_clock::now() - start;
  done = true;
  rescue.join();
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_LT(took, std::chrono::seconds(6));
  EXPECT_EQ(lines_of(result.err),
            (std::vector<std::string>{"error: download file://" + fifo + ": " + fifo +
                                      " is a FIFO, not a regular file; a file:// mirror must "
                                      "hold the files themselves"}))
      << result.err;
  EXPECT_EQ(testing::list_directory(dir.file("data")), std::vector<std::string>{});
}

// Two `dptrain download` into one directory: the second removed the first's live ".part". It is
// refused now with one line naming the first (exit 2), and the first goes on; a SIGTERM then
// ends the first with nothing left, not even the lock file.
TEST(CliDownload, SecondDownloadIntoOneDirectoryIsRefusedWithOneLine) {
  if (!download_supported()) GTEST_SKIP() << "this build of dptrain has no libcurl";
  DripServer server(20000);
  TempDir dir, logs;
  const std::string data = dir.file("data");
  const std::string part = data + "/" + kTestImagesFile + ".part";
  const auto first =
      testing::spawn_command(download_command(server.url(), data), {}, logs.file("first"));
  for (int i = 0; i < 400 && testing::file_size(part) <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const ino_t inode = inode_of(part);
  ASSERT_NE(inode, 0u);
  const auto second = testing::run_command(download_command(server.url(), data), {}, 15);
  EXPECT_EQ(second.exit_code, 2) << second.err;
  const auto lines = lines_of(second.err);
  ASSERT_EQ(lines.size(), 1u) << second.err;
  EXPECT_EQ(
      lines[0].rfind("error: download: " + data + " is in use by another dptrain download (pid " +
                         std::to_string(first.pid) + " on ",
                     0),
      0u)
      << lines[0];
  EXPECT_EQ(inode_of(part), inode);
  ASSERT_EQ(::kill(first.pid, SIGTERM), 0);
  const auto result = testing::wait_command(first, 15);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.err;
  EXPECT_EQ(testing::list_directory(data), std::vector<std::string>{});
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
  for (const auto& file : files) {
    EXPECT_TRUE(file.fetched) << file.name;
    EXPECT_EQ(file.bytes, fashion_mnist_sizes().at(file.name)) << file.name;  // the caps
  }
}

}  // namespace
}  // namespace dptrain
