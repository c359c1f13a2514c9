// Fetching the four Fashion-MNIST files into a directory (http://, https:// or file:// URLs),
// each checked against its known SHA-256 and moved into place only when whole and correct, one
// download per directory at a time: `dptrain download`'s fetcher, in the driver and linked by it
// alone (dptrain_download), the one code that needs libcurl.
// Not here: printing (the caller gets progress through a callback), reading the files (data.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace dptrain {

// Zalando's own mirror, as given in the Fashion-MNIST README.
extern const char* const kFashionMnistUrl;  // "http://fashion-mnist.s3-website.eu-central-1..."

// File name -> lower-case hex SHA-256 of the four published .gz files (see download.cpp for how
// the values were checked).
std::map<std::string, std::string> fashion_mnist_sha256();

// File name -> size in bytes of the same four files: what a mirror may send at most.
std::map<std::string, int64_t> fashion_mnist_sizes();

// The cap on a file whose size is not known (not in DownloadOptions::max_bytes): 64 MiB, over
// twice the largest Fashion-MNIST file.
constexpr int64_t kDefaultMaxDownloadBytes = int64_t{64} << 20;

struct DownloadOptions {
  std::string base_url = kFashionMnistUrl;        // each file is base_url + "/" + name
  std::string directory;                          // created (with its parents) when missing
  int attempts = 3;                               // tries per file, at least 1
  std::chrono::milliseconds retry_backoff{1000};  // wait before the 2nd try, doubled after
  std::chrono::milliseconds connect_timeout{15000};
  // An attempt slower than low_speed_bytes_per_second over low_speed_timeout (rounded up to
  // whole seconds) is abandoned; this also catches a server that accepts and then says nothing,
  // or drips. 10 KiB/s: the largest file (26 MB) would still take 45 minutes.
  std::chrono::milliseconds low_speed_timeout{30000};
  int64_t low_speed_bytes_per_second = 10240;
  // The whole download, every file and retry, ends by this deadline: a server just above the
  // low-speed limit cannot hold it for hours, nor a slow disk under a file:// mirror or under a
  // file already at a target name. 0 = none.
  std::chrono::milliseconds deadline{std::chrono::minutes(30)};
  // Set (by a signal handler) to a signal number to stop: the transfer is abandoned within a
  // second, its ".part" file removed, and DownloadStopped thrown.
  const std::atomic<int>* stop_signal = nullptr;
  bool force = false;  // fetch even when a file with the right checksum is there
  // The files to fetch and their checksums; tests serve small files of their own.
  std::map<std::string, std::string> expected_sha256 = fashion_mnist_sha256();
  // The published size of each file, so the most bytes it may have; a name not listed may have
  // up to default_max_bytes. A server that announces or sends more is refused at once (a
  // flooding mirror would otherwise fill the disk), and a file already at the target name with
  // another size is not the file: it is fetched again without being read.
  std::map<std::string, int64_t> max_bytes = fashion_mnist_sizes();
  int64_t default_max_bytes = kDefaultMaxDownloadBytes;
};

enum class DownloadStage {
  kSkipped,    // already present with the right checksum; bytes_done == bytes_total == its size
  kReceiving,  // bytes arriving; called as they are written
  kRetrying,   // an attempt failed (cause in `message`); the next starts after the backoff
  kDone,       // verified and moved into place
};

struct DownloadProgress {
  std::string file;  // the file name, e.g. "train-images-idx3-ubyte.gz"
  DownloadStage stage = DownloadStage::kReceiving;
  int64_t bytes_done = 0;
  int64_t bytes_total = -1;  // -1 while unknown (no Content-Length yet)
  int attempt = 1;           // 1-based; 0 for kSkipped
  std::string message;       // kRetrying only: why the attempt failed
};
using DownloadProgressFn = std::function<void(const DownloadProgress&)>;

struct DownloadedFile {
  std::string name;
  std::string path;      // directory + "/" + name
  bool fetched = false;  // false when skipped as already present
  int attempts = 0;      // tries used; 0 when skipped
  int64_t bytes = 0;     // size on disk
};

// Thrown when options.stop_signal asked the download to stop; nothing partial is left.
class DownloadStopped : public std::runtime_error {
 public:
  explicit DownloadStopped(int signal_number)
      : std::runtime_error("download stopped by signal " + std::to_string(signal_number)),
        signal_number_(signal_number) {}
  int signal_number() const { return signal_number_; }

 private:
  int signal_number_;
};

// `url` with any user name and password replaced by "***" ("http://***@host/"), for messages.
std::string redact_url(const std::string& url);

// Makes `options.directory` hold every file named in options.expected_sha256 with that checksum,
// in name order. The directory is locked for the whole call (flock on ".dptrain-download.lock",
// removed at the end): a second download into it is refused at once with a UsageError naming
// the holder ("pid N on HOST, since TIME"). A file already there is kept when it is a regular
// file of the size in options.max_bytes with the right checksum; anything else at the name is
// never read. A file is fetched to "<name>.part" in the same directory, fsync'ed, verified and
// renamed into place; a failed attempt deletes the ".part" file. A failure that a retry could
// cure (no connection, timeout, HTTP 408/429/5xx, checksum mismatch, write error) is retried
// up to options.attempts times with a doubling backoff; one that cannot (other HTTP 4xx, a
// file:// file that is missing or not a regular file, more bytes than options.max_bytes
// allows, response headers over 100 KiB) ends at once. Every wait ends by options.deadline and
// within about a second of a stop request (DownloadStopped), leaving no ".part": local files
// are opened without blocking, so a FIFO cannot hang the download. The ".part"
// file is always created new: a leftover one (this user's regular file, one link) is removed
// first, anything else at that name (a hard link, another user's file, a FIFO) is refused and
// left untouched. Throws UsageError for a bad option (URL scheme, attempts < 1, a malformed
// checksum, a size below 1) and DataError -- one line naming the URL or path and the cause,
// e.g. "download http://host/t10k-labels-idx1-ubyte.gz: HTTP 404" -- when the directory cannot
// be written, a file fails, or the deadline passes (not retried). No message holds the URL's
// credentials (redact_url). `progress`, when set, is called on the calling thread; an
// exception from it aborts the download (and is rethrown).
std::vector<DownloadedFile> download_fashion_mnist(const DownloadOptions& options,
                                                   const DownloadProgressFn& progress = {});

// False in a build without libcurl, where download_fashion_mnist throws UsageError saying so.
bool download_supported();

}  // namespace dptrain
