// Fetching Fashion-MNIST with libcurl (file:// URLs read here): one file at a time, to
// "<name>.part", verified by its SHA-256 (OpenSSL's), then renamed into place, under a lock on
// the directory. See download.h. Not here: decompressing or parsing the files (idx.h, data.h)
// and any output to the terminal.
#include "download.h"

#if defined(DPTRAIN_WITH_CURL)
#include <curl/curl.h>
#endif
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/core/sha256.h"
#include "dptrain/data/data.h"

namespace dptrain {

const char* const kFashionMnistUrl = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/";

// Note [Where the checksums come from]
// The Fashion-MNIST README publishes only MD5s of the four .gz files:
//   train-images 8d4fb7e6c68d591d4c3dfef9ec88bf0d   train-labels 25c81989df183df01b3e8a0aad5dffbe
//   t10k-images  bef4ecab320f06d8554ea6380940ec79   t10k-labels  bb300cfdad3c16e7a12a480ee83cd310
// Debian's dataset-fashion-mnist (0.0~git20200523.55506a9-1) ships the same deflate streams but
// re-written gzip headers (no file name, the 2020 build time), so its files do not match those
// MD5s. Putting the upstream header back -- FNAME set to the file name, XFL 0, OS 3 (Unix) and
// mtime 1504176606 (train-*) or 1504176627 (t10k-*), i.e. 2017-08-31 10:50 UTC -- gives files of
// the upstream sizes (fashion_mnist_sizes) whose MD5s equal the README's, and the SHA-256s of
// those files are the values below. They also agree with the checksums other projects publish
// for the same URLs.
std::map<std::string, std::string> fashion_mnist_sha256() {
  return {
      {kTrainImagesFile, "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"},
      {kTrainLabelsFile, "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"},
      {kTestImagesFile, "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"},
      {kTestLabelsFile, "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"},
  };
}

// The upstream sizes of Note [Where the checksums come from]: Debian's file plus the bytes of
// the FNAME field put back.
std::map<std::string, int64_t> fashion_mnist_sizes() {
  return {
      {kTrainImagesFile, 26421880},
      {kTrainLabelsFile, 29515},
      {kTestImagesFile, 4422102},
      {kTestLabelsFile, 5148},
  };
}

namespace {

// ---- Small POSIX helpers (Note [No std::filesystem] in files.cpp) ---------------------------

int64_t size_of(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 ? static_cast<int64_t>(info.st_size) : -1;
}

// ---- The ".part" file ------------------------------------------------------------------------

// Removes what stands at `path` when it is the leftover ".part" of an earlier run that was
// killed: a regular file of this user's with no other name. Anything else is refused, untouched:
// a hard link would have the file behind it (~/.bashrc, as root /etc/passwd) overwritten.
void remove_leftover_part(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return;  // gone meanwhile
    throw DataError("cannot write " + path + ": cannot look at it: " + errno_text(errno));
  }
  const std::string refused = "cannot write " + path + ": ";
  if (!S_ISREG(info.st_mode)) {
    throw DataError(refused + "it is " + file_kind(info.st_mode) +
                    "; dptrain replaces only a leftover .part file of its own; remove it");
  }
  if (info.st_uid != ::geteuid()) {
    throw DataError(refused + "it belongs to user " + std::to_string(info.st_uid) +
                    ", not to this one (" + std::to_string(::geteuid()) +
                    "); dptrain replaces only a leftover .part file of its own; remove it");
  }
  if (info.st_nlink != 1) {
    throw DataError(refused + "it has " + std::to_string(info.st_nlink) +
                    " hard links; dptrain does not write through a file shared with another "
                    "name; remove it");
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw DataError(refused + "cannot remove the leftover file: " + errno_text(errno));
  }
}

// Owns "<name>.part" while an attempt writes it: deleted on destruction unless moved into place.
class PartFile {
 public:
  // Always a new file (O_EXCL), so never a file that has another name too, nor anything that
  // is not a regular file; what stood there goes only through remove_leftover_part.
  explicit PartFile(std::string path) : path_(std::move(path)) {
    fd_ = create();
    if (fd_ < 0 && errno == EEXIST) {
      remove_leftover_part(path_);
      fd_ = create();
    }
    if (fd_ < 0) throw DataError("cannot write " + path_ + ": " + errno_text(errno));
  }
  ~PartFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }
  PartFile(const PartFile&) = delete;
  PartFile& operator=(const PartFile&) = delete;

  // Writes everything or returns the errno of the failure (0 on success).
  int write_all(const char* data, size_t size) { return dptrain::write_all(fd_, data, size); }

  // fsync, close and rename over `target`; the cause of a failure, or nullopt.
  std::optional<std::string> commit(const std::string& target) {
    if (::fsync(fd_) != 0) return "fsync " + path_ + ": " + errno_text(errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return "close " + path_ + ": " + errno_text(errno);
    struct stat info {};
    if (::lstat(target.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
      return target + " is " + file_kind(info.st_mode) + "; only a regular file is replaced";
    }
    if (::rename(path_.c_str(), target.c_str()) != 0) {
      return "rename " + path_ + " to " + target + ": " + errno_text(errno);
    }
    renamed_ = true;
    return std::nullopt;
  }

  const std::string& path() const { return path_; }

 private:
  int create() const {
    return ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  }

  std::string path_;
  int fd_ = -1;
  bool renamed_ = false;
};

using Clock = std::chrono::steady_clock;

// Throws DownloadStopped when a stop was requested.
void check_stop_request(const DownloadOptions& options) {
  if (options.stop_signal && options.stop_signal->load() != 0) {
    throw DownloadStopped(options.stop_signal->load());
  }
}

std::string deadline_text(const DownloadOptions& options) {
  return "the download's deadline of " + std::to_string(options.deadline.count() / 1000) +
         " s passed";
}

// ---- Local files, read without waiting on them -----------------------------------------------

// Note [No wait without a bound]
// Every wait in download_fashion_mnist ends by options.deadline, and within about a second of a
// stop request, leaving no ".part" behind: libcurl's transfers through CURLOPT_TIMEOUT_MS and
// the progress callback (check_stop), the backoff in short naps, the directory's lock by
// refusing at once (never waiting for the holder), and the local files -- a file:// mirror's, a
// file already at a target name -- by reading them in 1 MiB pieces with both checked between
// pieces. Those files are opened with O_NONBLOCK and used only when fstat then says they are
// regular: open() of a FIFO that has no writer would otherwise never return, whatever the
// signal handlers' SA_RESTART says. libcurl's own file:// reader opens without O_NONBLOCK,
// which is why dptrain reads file:// URLs itself. A file at a target name is hashed only when
// its size is the published one (DownloadOptions::max_bytes): a sparse 20 GiB file there was
// hashed for 71 s before a SIGTERM took effect.

// Closes a descriptor on the way out.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// `path` open for reading without waiting on it (Note [No wait without a bound]); -1 and errno
// on failure. The caller must fstat it before reading: it may be a FIFO or a device.
int open_without_waiting(const std::string& path) {
  return ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
}

// How much of a local file is read between two checks of the stop request and the deadline:
// about a millisecond of hashing.
constexpr size_t kLocalPieceBytes = size_t{1} << 20;

// The size `name` must have to be the published file; -1 for a name without one, which may
// have up to options.default_max_bytes.
int64_t published_size(const DownloadOptions& options, const std::string& name) {
  const auto known = options.max_bytes.find(name);
  return known != options.max_bytes.end() ? known->second : -1;
}

// Whether `path` already holds `name`: a regular file of its published size (of at most
// default_max_bytes for a name without one) whose SHA-256 is `expected`. Anything else at the
// name (a FIFO, another size) is not the file and is not read. A stop request ends the hashing
// (DownloadStopped), and so does the deadline (DataError).
bool already_present(const std::string& path, const std::string& name, const std::string& expected,
                     const DownloadOptions& options, Clock::time_point deadline) {
  const Descriptor file(open_without_waiting(path));
  struct stat info {};
  if (file.get() < 0 || ::fstat(file.get(), &info) != 0 || !S_ISREG(info.st_mode)) return false;
  const int64_t size = info.st_size;
  const int64_t published = published_size(options, name);
  if (published >= 0 ? size != published : size > options.default_max_bytes) return false;
  Sha256 hash;
  std::vector<char> piece(kLocalPieceBytes);
  for (int64_t done = 0; done < size;) {
    check_stop_request(options);
    if (Clock::now() >= deadline) {
      throw DataError("download: checking " + path + ": " + deadline_text(options));
    }
    const auto want = static_cast<size_t>(std::min<int64_t>(size - done, kLocalPieceBytes));
    const ssize_t got = ::read(file.get(), piece.data(), want);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;  // it shrank, or cannot be read: fetch it again
    hash.update(piece.data(), static_cast<size_t>(got));
    done += got;
  }
  return hash.hex_digest() == expected;
}

// ---- The directory's lock --------------------------------------------------------------------

// Note [One download per directory]
// Two downloads into one directory would share "<name>.part": the second would remove the
// first's live file as a leftover, and the first to finish could rename the other's half-written
// file into place. So a download holds a HolderLock (files.h) on
// "<directory>/.dptrain-download.lock" from before it looks at any file until it returns; a second one is refused at once, naming
// the holder, as a second run is from a checkpoint directory or a second writer from an output.
// Under the lock a ".part" can only be a dead run's leftover, so remove_leftover_part stays
// safe. The lock file is removed on the way out so that the directory holds only the data. A
// directory this user cannot write into gets no lock: nothing can be written there, so a file
// that must be fetched fails on its ".part" instead, while a download whose files are all
// present still succeeds.
constexpr char kDownloadLockName[] = ".dptrain-download.lock";

std::unique_ptr<HolderLock> lock_download_directory(const std::string& directory) {
  if (::access(directory.c_str(), W_OK) != 0) return nullptr;  // read-only: no lock (the Note)
  try {
    return std::make_unique<HolderLock>(directory + "/" + kDownloadLockName, "download",
                                        /*remove_when_done=*/true);
  } catch (const HolderLock::Held& held) {
    throw UsageError("download: " + directory + " is in use by another dptrain download" +
                     (held.holder().empty() ? std::string() : " (" + held.holder() + ")") +
                     "; wait for it to end, or give this one a directory of its own");
  }
}

#if defined(DPTRAIN_WITH_CURL)
// ---- One attempt with libcurl ----------------------------------------------------------------

void init_curl_once() {
  static std::once_flag once;
  static CURLcode result = CURLE_OK;
  std::call_once(once, [] { result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (result != CURLE_OK) {
    throw DataError(std::string("cannot initialise libcurl: ") + curl_easy_strerror(result));
  }
}

struct CurlDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};

// Why an attempt failed, and whether another attempt could go differently.
struct AttemptFailure {
  std::string cause;
  bool retriable = true;
};

// What the write callback needs; it must not throw through libcurl's C frames.
struct Transfer {
  CURL* curl = nullptr;     // null for a file:// URL, which is read here
  int64_t local_size = -1;  // a file:// URL's size, as fstat gave it
  PartFile* part = nullptr;
  Sha256 hash;
  int64_t bytes = 0;
  int write_errno = 0;
  int64_t max_bytes = 0;         // the most `name` may have; more is refused, never written
  int64_t announced_bytes = -1;  // a Content-Length above max_bytes, once refused
  bool too_many_bytes = false;   // the body went past max_bytes
  int64_t header_bytes = 0;      // of every response header line so far, redirects included
  bool too_many_header_bytes = false;  // they went past kMaxHeaderBytes
  const DownloadProgressFn* progress = nullptr;
  DownloadProgress report;
  std::chrono::steady_clock::time_point last_report{};
  std::exception_ptr callback_error;
  const std::atomic<int>* stop_signal = nullptr;
};

// libcurl calls this about once a second even while nothing arrives: a stop request ends the
// transfer (CURLE_ABORTED_BY_CALLBACK) without waiting for the next byte.
int check_stop(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto& transfer = *static_cast<const Transfer*>(user);
  return transfer.stop_signal && transfer.stop_signal->load() != 0 ? 1 : 0;
}

// How often kReceiving is reported at most: enough for a progress bar.
constexpr std::chrono::milliseconds kProgressInterval{100};

// The most bytes of response headers an attempt takes, all lines and redirects together; one
// line is capped by libcurl itself at the same CURL_MAX_HTTP_HEADER (100 KiB), which it reports
// as "Out of memory" (header_failure). A mirror sends well under 1 KiB.
constexpr int64_t kMaxHeaderBytes = CURL_MAX_HTTP_HEADER;

// Called for each header line, after libcurl has read it: a successful response that announces
// more than the file may have is refused before its first byte (libcurl then ends with
// CURLE_WRITE_ERROR). Not CURLOPT_MAXFILESIZE: it fails inside libcurl, which does not say the
// length it refused. Endless header lines are refused at kMaxHeaderBytes.
size_t check_announced_size(char*, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  transfer.header_bytes += static_cast<int64_t>(size * count);
  if (transfer.header_bytes > kMaxHeaderBytes) {
    transfer.too_many_header_bytes = true;
    return 0;
  }
  long status = 0;
  curl_off_t length = -1;
  if (curl_easy_getinfo(transfer.curl, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK &&
      status / 100 == 2 &&
      curl_easy_getinfo(transfer.curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK &&
      length > transfer.max_bytes) {
    transfer.announced_bytes = static_cast<int64_t>(length);
    return 0;
  }
  return size * count;
}

size_t write_body(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const size_t total = size * count;
  // Checked before writing, so the disk never holds more than max_bytes (a mirror that floods
  // without a Content-Length would otherwise fill it).
  if (transfer.bytes + static_cast<int64_t>(total) > transfer.max_bytes) {
    transfer.too_many_bytes = true;
    return 0;  // libcurl then ends with CURLE_WRITE_ERROR
  }
  transfer.write_errno = transfer.part->write_all(data, total);
  if (transfer.write_errno != 0) return 0;  // libcurl then ends with CURLE_WRITE_ERROR
  transfer.hash.update(data, total);
  transfer.bytes += static_cast<int64_t>(total);
  const auto now = std::chrono::steady_clock::now();
  if (*transfer.progress && now - transfer.last_report >= kProgressInterval) {
    transfer.last_report = now;
    curl_off_t length = transfer.local_size;
    if (transfer.curl &&
        curl_easy_getinfo(transfer.curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) != CURLE_OK) {
      length = -1;
    }
    transfer.report.bytes_done = transfer.bytes;
    transfer.report.bytes_total = length >= 0 ? static_cast<int64_t>(length) : -1;
    try {
      (*transfer.progress)(transfer.report);
    } catch (...) {
      transfer.callback_error = std::current_exception();
      return 0;
    }
  }
  return total;
}

// curl's own retry rule (curl --retry): only these HTTP statuses can be transient.
bool is_transient_http_status(long status) {
  return status == 408 || status == 429 || status >= 500;
}

int64_t max_bytes_of(const DownloadOptions& options, const std::string& name) {
  const auto known = options.max_bytes.find(name);
  return known != options.max_bytes.end() ? known->second : options.default_max_bytes;
}

// Why a transfer that went past its cap failed; nullopt when it did not.
std::optional<std::string> too_many_bytes_text(const Transfer& transfer, const std::string& name) {
  if (transfer.announced_bytes < 0 && !transfer.too_many_bytes) return std::nullopt;
  const std::string limit = std::to_string(transfer.max_bytes);
  return "the server sent more than the " + limit + " bytes " + name + " has " +
         (transfer.announced_bytes >= 0
              ? "(Content-Length " + std::to_string(transfer.announced_bytes) + ")"
              : "(more than " + limit + " bytes arrived)");
}

// What a failed curl_easy_perform means for the attempt (`code` not CURLE_OK): its cause in
// words, and whether another attempt may do better.
AttemptFailure perform_failure(CURLcode code, CURL* handle, const Transfer& transfer,
                               const PartFile& part, const char* error_text) {
  if (code == CURLE_HTTP_RETURNED_ERROR) {
    long status = 0;
    curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &status);
    return AttemptFailure{"HTTP " + std::to_string(status), is_transient_http_status(status)};
  }
  if (code == CURLE_WRITE_ERROR && transfer.write_errno != 0) {
    return AttemptFailure{"writing " + part.path() + ": " + errno_text(transfer.write_errno), true};
  }
  // A mirror that sends such headers will send them again: not retried.
  if (transfer.too_many_header_bytes) {
    return AttemptFailure{"the server's response headers are longer than " +
                              std::to_string(kMaxHeaderBytes) + " bytes in all",
                          false};
  }
  // libcurl 7.x's word for a header line past CURL_MAX_HTTP_HEADER, before any body byte.
  if (code == CURLE_OUT_OF_MEMORY && transfer.bytes == 0) {
    return AttemptFailure{
        "a response header line from the server is longer than libcurl's limit of " +
            std::to_string(CURL_MAX_HTTP_HEADER) + " bytes (libcurl says \"Out of memory\")",
        false};
  }
  std::string cause = error_text[0] != '\0' ? error_text : curl_easy_strerror(code);
  while (!cause.empty() && std::isspace(static_cast<unsigned char>(cause.back()))) {
    cause.pop_back();
  }
  const bool retriable = code != CURLE_UNSUPPORTED_PROTOCOL && code != CURLE_URL_MALFORMAT &&
                         code != CURLE_FILE_COULDNT_READ_FILE;
  return AttemptFailure{cause, retriable};
}

// ---- One attempt of a file:// URL, read here (Note [No wait without a bound]) -------------------

// The path a file:// URL names, percent-encoding undone as libcurl's own reader would; nullopt
// with `why` set when libcurl's URL parser refuses the URL (a host other than localhost).
std::optional<std::string> local_path_of(const std::string& url, std::string* why) {
  std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> parsed(curl_url(), curl_url_cleanup);
  if (!parsed) {
    *why = "cannot parse the URL: out of memory";
    return std::nullopt;
  }
  char* path = nullptr;
  CURLUcode code = curl_url_set(parsed.get(), CURLUPART_URL, url.c_str(), CURLU_ALLOW_SPACE);
  if (code == CURLUE_OK) code = curl_url_get(parsed.get(), CURLUPART_PATH, &path, CURLU_URLDECODE);
  if (code != CURLUE_OK) {
    *why = "not a usable file:// URL: " + std::string(curl_url_strerror(code));
    return std::nullopt;
  }
  std::string result(path);
  curl_free(path);
  return result;
}

// Copies the file `url` names into transfer.part in pieces, checking the stop request and the
// deadline between them; only a regular file is read. A failure that another attempt cannot
// cure (no such file, not a regular file, too large) is not retried.
std::optional<AttemptFailure> copy_local_file(const std::string& url, const std::string& name,
                                              Transfer& transfer, const DownloadOptions& options,
                                              Clock::time_point deadline) {
  std::string why;
  const auto path = local_path_of(url, &why);
  if (!path) return AttemptFailure{why, false};
  const Descriptor file(open_without_waiting(*path));
  struct stat info {};
  if (file.get() < 0 || ::fstat(file.get(), &info) != 0) {
    return AttemptFailure{"cannot read " + *path + ": " + errno_text(errno), false};
  }
  if (!S_ISREG(info.st_mode)) {
    return AttemptFailure{*path + " is " + file_kind(info.st_mode) +
                              ", not a regular file; a file:// mirror must hold the files "
                              "themselves",
                          false};
  }
  if (info.st_size > transfer.max_bytes) {
    return AttemptFailure{*path + " has " + std::to_string(info.st_size) +
                              " bytes, more than the " + std::to_string(transfer.max_bytes) +
                              " bytes " + name + " has",
                          false};
  }
  transfer.local_size = info.st_size;
  std::vector<char> piece(kLocalPieceBytes);
  for (;;) {
    if (options.stop_signal && options.stop_signal->load() != 0) return std::nullopt;
    if (Clock::now() >= deadline) return AttemptFailure{deadline_text(options), false};
    const ssize_t got = ::read(file.get(), piece.data(), piece.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return AttemptFailure{"cannot read " + *path + ": " + errno_text(errno), true};
    if (got == 0) return std::nullopt;
    if (write_body(piece.data(), 1, static_cast<size_t>(got), &transfer) == 0) {
      if (transfer.callback_error) return std::nullopt;  // rethrown by the caller
      if (transfer.write_errno != 0) {
        return AttemptFailure{
            "writing " + transfer.part->path() + ": " + errno_text(transfer.write_errno), true};
      }
      return std::nullopt;  // too_many_bytes: the caller says so
    }
  }
}

// ---- One attempt of an http(s):// URL with libcurl -------------------------------------------

// `left` is the time to the download's deadline, or none.
std::optional<AttemptFailure> transfer_with_curl(const std::string& url, Transfer& transfer,
                                                 const DownloadOptions& options,
                                                 std::optional<std::chrono::milliseconds> left,
                                                 Clock::time_point deadline) {
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) return AttemptFailure{"cannot create a libcurl handle", true};
  transfer.curl = curl.get();
  char error_text[CURL_ERROR_SIZE] = {};

  CURL* handle = curl.get();
  curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
#if LIBCURL_VERSION_NUM >= 0x075500  // 7.85: the string forms; the bit masks are deprecated
  curl_easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(handle, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(handle, CURLOPT_PROTOCOLS, CURLPROTO_HTTP | CURLPROTO_HTTPS);
  curl_easy_setopt(handle, CURLOPT_REDIR_PROTOCOLS, CURLPROTO_HTTP | CURLPROTO_HTTPS);
#endif
  curl_easy_setopt(handle, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(handle, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(handle, CURLOPT_FAILONERROR, 1L);  // HTTP >= 400 is an error, not a body
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);     // no SIGALRM: the caller may have threads
  curl_easy_setopt(handle, CURLOPT_USERAGENT, "dptrain");
  curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error_text);
  curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options.connect_timeout.count()));
  const auto low_speed_seconds =
      std::max<int64_t>(1, (options.low_speed_timeout.count() + 999) / 1000);
  curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, static_cast<long>(low_speed_seconds));
  curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT,
                   static_cast<long>(std::max<int64_t>(1, options.low_speed_bytes_per_second)));
  if (left) curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, static_cast<long>(left->count()));
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, check_announced_size);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, check_stop);
  curl_easy_setopt(handle, CURLOPT_XFERINFODATA, &transfer);
  curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);

  const CURLcode code = curl_easy_perform(handle);
  transfer.curl = nullptr;  // `curl` goes with this scope
  if (code == CURLE_OK || transfer.callback_error) return std::nullopt;
  if (options.stop_signal && options.stop_signal->load() != 0) return std::nullopt;
  if (transfer.announced_bytes >= 0 || transfer.too_many_bytes) return std::nullopt;
  if (code == CURLE_OPERATION_TIMEDOUT && Clock::now() >= deadline) {
    return AttemptFailure{deadline_text(options), false};
  }
  return perform_failure(code, handle, transfer, *transfer.part, error_text);
}

// ---- One attempt ---------------------------------------------------------------------------

bool is_file_url(const std::string& url) {
  std::string scheme = url.substr(0, 7);
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return scheme == "file://";
}

// `deadline` is when the whole download must end (Clock::time_point::max() for never).
std::optional<AttemptFailure> fetch_once(const std::string& url, const std::string& target,
                                         const std::string& expected_sha256,
                                         const DownloadOptions& options, Clock::time_point deadline,
                                         int attempt, const std::string& name,
                                         const DownloadProgressFn& progress) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return AttemptFailure{deadline_text(options), false};
  PartFile part(target + ".part");  // throws DataError when the directory is not writable

  Transfer transfer;
  transfer.part = &part;
  transfer.progress = &progress;
  transfer.report.file = name;
  transfer.report.attempt = attempt;
  transfer.stop_signal = options.stop_signal;
  transfer.max_bytes = max_bytes_of(options, name);

  auto failure = is_file_url(url)
                     ? copy_local_file(url, name, transfer, options, deadline)
                     : transfer_with_curl(url, transfer, options,
                                          deadline != Clock::time_point::max()
                                              ? std::optional<std::chrono::milliseconds>(left)
                                              : std::nullopt,
                                          deadline);
  if (transfer.callback_error) std::rethrow_exception(transfer.callback_error);
  check_stop_request(options);  // `part` is removed on the way out
  // The mirror is wrong, not slow: another try would only fill the disk again.
  if (auto too_many = too_many_bytes_text(transfer, name)) return AttemptFailure{*too_many, false};
  if (failure) return failure;

  const std::string got = transfer.hash.hex_digest();
  if (got != expected_sha256) {
    return AttemptFailure{"SHA-256 mismatch: got " + got + ", expected " + expected_sha256, true};
  }
  if (auto commit_failure = part.commit(target)) return AttemptFailure{*commit_failure, true};
  return std::nullopt;
}

#else  // built without libcurl (third_party/dependencies.cmake, DPTRAIN_DOWNLOAD)

// Why an attempt failed, and whether another attempt could go differently.
struct AttemptFailure {
  std::string cause;
  bool retriable = true;
};

void init_curl_once() {
  throw UsageError(
      "download: this build of dptrain has no libcurl (it was not found when dptrain was "
      "built); copy the four Fashion-MNIST files into the data directory instead");
}

// Unreachable, as init_curl_once threw: it only keeps download_fashion_mnist one function.
std::optional<AttemptFailure> fetch_once(const std::string&, const std::string&, const std::string&,
                                         const DownloadOptions&, Clock::time_point, int,
                                         const std::string&, const DownloadProgressFn&) {
  return AttemptFailure{"no libcurl in this build", false};
}

#endif  // DPTRAIN_WITH_CURL

// ---- Checking the options --------------------------------------------------------------------

bool has_supported_scheme(const std::string& url) {
  std::string lower = url.substr(0, 8);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.rfind("http://", 0) == 0 || lower.rfind("https://", 0) == 0 ||
         lower.rfind("file://", 0) == 0;
}

bool is_hex_sha256(const std::string& digest) {
  return digest.size() == 64 && std::all_of(digest.begin(), digest.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Where the user name and password of `url` are ("user:secret" in "http://user:secret@host/"):
// {start, length}, length 0 when there are none. Without a scheme the text is read as one.
std::pair<size_t, size_t> credentials_in(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t start = scheme == std::string::npos ? 0 : scheme + 3;
  const size_t end = std::min(url.find_first_of("/?#", start), url.size());
  const size_t at = url.substr(start, end - start).rfind('@');
  return {start, at == std::string::npos ? 0 : at};
}

// `text` with every occurrence of `url`'s credentials replaced by "***" (libcurl's own
// messages may quote the URL).
std::string redact_in(std::string text, const std::string& url) {
  const auto [start, length] = credentials_in(url);
  if (length == 0) return text;
  const std::string secret = url.substr(start, length);
  for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at + 3)) {
    text.replace(at, secret.size(), "***");
  }
  return text;
}

void check_options(const DownloadOptions& options) {
  if (!has_supported_scheme(options.base_url)) {
    throw UsageError("download URL '" + redact_url(options.base_url) +
                     "' is not supported: it must start with http://, https:// or file://");
  }
  if (options.directory.empty()) throw UsageError("download: no directory given");
  if (options.deadline.count() < 0 || options.low_speed_bytes_per_second < 1 ||
      options.low_speed_timeout.count() < 1) {
    throw UsageError("download: the deadline, the low-speed limit and its time must be positive");
  }
  if (options.default_max_bytes < 1 ||
      std::any_of(options.max_bytes.begin(), options.max_bytes.end(),
                  [](const auto& entry) { return entry.second < 1; })) {
    throw UsageError("download: every file's maximum size must be at least 1 byte");
  }
  if (options.attempts < 1) {
    throw UsageError("download: attempts must be at least 1, got " +
                     std::to_string(options.attempts));
  }
  for (const auto& [name, digest] : options.expected_sha256) {
    if (name.empty() || name.find('/') != std::string::npos || !is_hex_sha256(digest)) {
      throw UsageError("download: bad expected checksum entry '" + name + "' -> '" + digest +
                       "' (want a plain file name and 64 lower-case hex digits)");
    }
  }
}

}  // namespace

// ---- The driver-facing entry point -----------------------------------------------------------

std::string redact_url(const std::string& url) {
  const auto [start, length] = credentials_in(url);
  if (length == 0) return url;
  return url.substr(0, start) + "***" + url.substr(start + length);
}

std::vector<DownloadedFile> download_fashion_mnist(const DownloadOptions& options,
                                                   const DownloadProgressFn& progress) {
  check_options(options);
  init_curl_once();
  make_directories(options.directory, "cannot create download directory " + options.directory);
  // Note [One download per directory]
  const auto lock = lock_download_directory(options.directory);

  std::string base = options.base_url;
  while (!base.empty() && base.back() == '/') base.pop_back();

  const auto deadline =
      options.deadline.count() > 0 ? Clock::now() + options.deadline : Clock::time_point::max();
  std::vector<DownloadedFile> results;
  for (const auto& [name, expected] : options.expected_sha256) {
    check_stop_request(options);
    DownloadedFile file;
    file.name = name;
    file.path = options.directory + "/" + name;

    if (!options.force && already_present(file.path, name, expected, options, deadline)) {
      file.bytes = size_of(file.path);
      if (progress) {
        DownloadProgress report;
        report.file = name;
        report.stage = DownloadStage::kSkipped;
        report.bytes_done = report.bytes_total = file.bytes;
        report.attempt = 0;
        progress(report);
      }
      results.push_back(file);
      continue;
    }

    const std::string url = base + "/" + name;
    int attempt = 1;
    for (;; ++attempt) {
      auto failure =
          fetch_once(url, file.path, expected, options, deadline, attempt, name, progress);
      if (!failure) break;
      failure->cause = redact_in(failure->cause, url);
      if (!failure->retriable || attempt >= options.attempts) {
        std::string message = "download " + redact_url(url) + ": " + failure->cause;
        if (attempt > 1) message += " (gave up after " + std::to_string(attempt) + " attempts)";
        throw DataError(message);
      }
      if (progress) {
        DownloadProgress report;
        report.file = name;
        report.stage = DownloadStage::kRetrying;
        report.attempt = attempt;
        report.message = failure->cause;
        progress(report);
      }
      // The backoff in short naps, so that a stop request is not kept waiting.
      const auto resume_at =
          Clock::now() + options.retry_backoff * (1 << std::min(attempt - 1, 10));
      while (Clock::now() < std::min(resume_at, deadline)) {
        check_stop_request(options);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    file.attempts = attempt;
    file.fetched = true;
    file.bytes = size_of(file.path);
    sync_directory(options.directory);
    if (progress) {
      DownloadProgress report;
      report.file = name;
      report.stage = DownloadStage::kDone;
      report.bytes_done = report.bytes_total = file.bytes;
      report.attempt = file.attempts;
      progress(report);
    }
    results.push_back(file);
  }
  return results;
}

bool download_supported() {
#if defined(DPTRAIN_WITH_CURL)
  return true;
#else
  return false;
#endif
}

}  // namespace dptrain
