// Shared test helpers; see test_support.h.
#include "support/test_support.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "dptrain/core/errors.h"

namespace dptrain::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/dptrain-test-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() { remove_tree(path_); }

bool path_exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}

bool is_regular_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

int64_t file_size(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 ? static_cast<int64_t>(info.st_size) : -1;
}

void remove_path(const std::string& path) { std::remove(path.c_str()); }

void remove_tree(const std::string& path) {
  // Depth first, without following symbolic links: children before their directory.
  nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int, struct FTW*) {
        std::remove(entry);
        return 0;
      },
      /*nopenfd=*/16, FTW_DEPTH | FTW_PHYS);
}

void make_directories(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw std::runtime_error("mkdir " + prefix + ": " + std::strerror(errno));
    }
    if (slash == std::string::npos) break;
  }
}

std::string current_directory() {
  char buffer[4096];
  if (::getcwd(buffer, sizeof buffer) == nullptr) throw std::runtime_error("getcwd failed");
  return buffer;
}

void change_directory(const std::string& path) {
  if (::chdir(path.c_str()) != 0) throw std::runtime_error("chdir " + path + " failed");
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

bool searchable_by_others(const std::string& path) {
  if (path.empty() || path[0] != '/') return false;
  for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    const std::string prefix = end == std::string::npos ? path : path.substr(0, end);
    struct stat info {};
    if (::stat(prefix.empty() ? "/" : prefix.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) ||
        (info.st_mode & S_IXOTH) == 0) {
      return false;
    }
    if (end == std::string::npos) return true;
  }
}

namespace {

// Copies the file `from` to `to` and gives the copy `mode`; false if any of it failed.
bool copy_with_mode(const std::string& from, const std::string& to, mode_t mode) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary);
  out << in.rdbuf();
  out.close();
  return in && out && ::chmod(to.c_str(), mode) == 0;
}

}  // namespace

ProgramCopyForAnyUser::ProgramCopyForAnyUser(const std::string& program) {
  std::vector<std::string> bases;
  if (const char* tmpdir = std::getenv("TMPDIR"); tmpdir != nullptr && *tmpdir == '/') {
    bases.emplace_back(tmpdir);
  }
  for (const char* base : {"/tmp", "/var/tmp", "/dev/shm"}) bases.emplace_back(base);
  for (const auto& base : bases) {
    if (!searchable_by_others(base)) continue;
    std::string pattern = base + "/dptrain-any-user-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) continue;
    directory_ = pattern;
    break;
  }
  if (directory_.empty()) {
    throw std::runtime_error("no directory every user may enter among $TMPDIR, /tmp, /var/tmp, "
                             "/dev/shm: cannot give another user a copy of " + program);
  }
  path_ = directory_ + "/" + program.substr(program.rfind('/') + 1);
  if (!copy_with_mode(program, path_, 0755) || ::chmod(directory_.c_str(), 0755) != 0) {
    remove_tree(directory_);
    throw std::runtime_error("cannot copy " + program + " into " + directory_);
  }
}

ProgramCopyForAnyUser::~ProgramCopyForAnyUser() { remove_tree(directory_); }

std::map<std::string, std::string> ProgramCopyForAnyUser::sanitizer_environment() const {
  std::map<std::string, std::string> environment;
  for (const char* name : {"ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    // "key=value:key=value"; each suppressions=PATH becomes this directory's copy of PATH.
    std::string options = value, rewritten;
    for (size_t begin = 0; begin <= options.size();) {
      size_t end = options.find(':', begin);
      if (end == std::string::npos) end = options.size();
      std::string option = options.substr(begin, end - begin);
      const std::string key = "suppressions=";
      if (option.rfind(key, 0) == 0) {
        const std::string copy = directory_ + "/" + name + ".supp";
        if (!copy_with_mode(option.substr(key.size()), copy, 0644)) {
          throw std::runtime_error("cannot copy " + option.substr(key.size()) + " into " + copy);
        }
        option = key + copy;
      }
      rewritten += (rewritten.empty() ? "" : ":") + option;
      begin = end + 1;
    }
    environment[name] = rewritten;
  }
  return environment;
}

std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& bytes) {
  z_stream stream{};
  // 16 + MAX_WBITS asks deflate for a gzip wrapper.
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::runtime_error("deflateInit2 failed");
  }
  std::vector<uint8_t> out(deflateBound(&stream, bytes.size()) + 64);
  stream.next_in = const_cast<Bytef*>(bytes.data());
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("deflate failed");
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

std::vector<uint8_t> gzip_then_zeros(const std::vector<uint8_t>& head, size_t zeros) {
  z_stream stream{};
  if (deflateInit2(&stream, 9, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::runtime_error("deflateInit2 failed");
  }
  std::vector<uint8_t> out;
  const std::vector<uint8_t> chunk(1 << 20);
  std::vector<uint8_t> piece(1 << 16);
  const auto feed = [&](const uint8_t* data, size_t size, int flush) {
    stream.next_in = const_cast<Bytef*>(data);
    stream.avail_in = static_cast<uInt>(size);
    do {
      stream.next_out = piece.data();
      stream.avail_out = static_cast<uInt>(piece.size());
      deflate(&stream, flush);
      out.insert(out.end(), piece.data(), stream.next_out);
    } while (stream.avail_out == 0);
  };
  feed(head.data(), head.size(), Z_NO_FLUSH);
  for (size_t left = zeros; left > 0;) {
    const size_t now = std::min(left, chunk.size());
    feed(chunk.data(), now, Z_NO_FLUSH);
    left -= now;
  }
  feed(nullptr, 0, Z_FINISH);
  deflateEnd(&stream);
  return out;
}

std::vector<uint8_t> make_idx(uint8_t type, const std::vector<uint32_t>& dims,
                              const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes{0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(d >> shift));
  }
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

void expect_data_error(const std::function<void()>& action,
                       const std::vector<std::string>& phrases) {
  expect_throws<DataError>(action, phrases);
}

namespace {

// Forks `args` (args[0] is the program) with `extra_env` added and its standard output and error
// on `out_fd` and `err_fd`, in a process group of its own so that killing the group after a
// timeout reaches its children too. The child closes `close_in_child` first.
// Applies `setup` in the child; false (with a line on stderr) when it could not.
bool apply_child_setup(const ChildSetup& setup) {
  if (!setup.stdout_path.empty()) {
    const int fd = open(setup.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0) {
      std::fprintf(stderr, "child setup: stdout to %s: %s\n", setup.stdout_path.c_str(),
                   std::strerror(errno));
      return false;
    }
    close(fd);
  }
  // Each limit lowers only the soft value, as `ulimit -S` would.
  const auto lower_soft_limit = [](decltype(RLIMIT_AS) resource, const char* name, int64_t bytes) {
    rlimit limit{};
    getrlimit(resource, &limit);
    limit.rlim_cur = static_cast<rlim_t>(bytes);
    if (setrlimit(resource, &limit) == 0) return true;
    std::fprintf(stderr, "child setup: %s: %s\n", name, std::strerror(errno));
    return false;
  };
  if (setup.stack_limit_bytes > 0 &&
      !lower_soft_limit(RLIMIT_STACK, "RLIMIT_STACK", setup.stack_limit_bytes)) {
    return false;
  }
  if (setup.file_size_limit_bytes > 0) {
    // SIGXFSZ at its default (death), as for a user's `ulimit -f`: the program must cope.
    ::signal(SIGXFSZ, SIG_DFL);
    if (!lower_soft_limit(RLIMIT_FSIZE, "RLIMIT_FSIZE", setup.file_size_limit_bytes)) return false;
  }
  if (setup.address_space_limit_bytes > 0 &&
      !lower_soft_limit(RLIMIT_AS, "RLIMIT_AS", setup.address_space_limit_bytes)) {
    return false;
  }
  if (setup.run_as_uid >= 0) {
    if (setgroups(0, nullptr) != 0 || setgid(static_cast<gid_t>(setup.run_as_gid)) != 0 ||
        setuid(static_cast<uid_t>(setup.run_as_uid)) != 0) {
      std::fprintf(stderr, "child setup: switching to uid %d: %s\n", setup.run_as_uid,
                   std::strerror(errno));
      return false;
    }
  }
  return true;
}

pid_t start_child(const std::vector<std::string>& args,
                  const std::map<std::string, std::string>& extra_env, int out_fd, int err_fd,
                  std::initializer_list<int> close_in_child, const ChildSetup& setup = {}) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    for (int fd : close_in_child) close(fd);
    if (!apply_child_setup(setup)) _exit(kChildSetupFailed);
    for (int fd : setup.closed_descriptors) close(fd);  // last: a failure above still reports
    for (const auto& [name, value] : extra_env) setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also in the parent, so a kill right after fork finds the group
  return pid;
}

// The exit status, or 128 + N for a child killed by signal N, as a shell reports it.
int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void drain(int fd, std::string& into) {
  char buffer[4096];
  const ssize_t n = read(fd, buffer, sizeof buffer);
  if (n > 0) into.append(buffer, static_cast<size_t>(n));
}

}  // namespace

CommandResult run_command(const std::vector<std::string>& args,
                          const std::map<std::string, std::string>& extra_env, int timeout_seconds,
                          const ChildSetup& setup) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = start_child(args, extra_env, out_pipe[1], err_pipe[1],
                                {out_pipe[0], err_pipe[0], out_pipe[1], err_pipe[1]}, setup);
  close(out_pipe[1]), close(err_pipe[1]);
  CommandResult result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP))) {
        char buffer[4096];
        const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
        if (n > 0) {
          (i == 0 ? result.out : result.err).append(buffer, static_cast<size_t>(n));
        } else {
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        }
      }
    }
  }
  for (auto& fd : fds) {
    if (fd.fd >= 0) {
      drain(fd.fd, fd.fd == out_pipe[0] ? result.out : result.err);
      close(fd.fd);
    }
  }
  // Its I/O counts are read while it is a zombie: once reaped, /proc/PID is gone.
  siginfo_t exited{};
  if (waitid(P_PID, static_cast<id_t>(pid), &exited, WEXITED | WNOWAIT) == 0) {
    result.bytes_read = bytes_read_by(std::to_string(pid));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = exit_code_of(status);
  return result;
}

FreshChildEnvironment::FreshChildEnvironment(const std::string& name, const std::string& value)
    : name_(name), style_(GTEST_FLAG_GET(death_test_style)) {
  if (const char* old = std::getenv(name.c_str())) {
    had_value_ = true;
    old_value_ = old;
  }
  ::setenv(name.c_str(), value.c_str(), 1);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
}

FreshChildEnvironment::~FreshChildEnvironment() {
  GTEST_FLAG_SET(death_test_style, style_);
  if (had_value_) {
    ::setenv(name_.c_str(), old_value_.c_str(), 1);
  } else {
    ::unsetenv(name_.c_str());
  }
}

int64_t bytes_read_by(const std::string& pid) {
  std::ifstream io("/proc/" + pid + "/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return -1;
}

namespace {

// Whether the thread whose stat file this is sleeps (S, or D in the kernel). "tid (comm) S ...":
// the state follows the last ')', since comm may hold spaces and ')'.
bool sleeps(const std::string& stat_path) {
  const std::string stat = read_text(stat_path);
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  return stat[close + 2] == 'S' || stat[close + 2] == 'D';
}

// Whether every one of the threads `stat_paths` lists sleeps, in two looks 50 ms apart, within
// `timeout_ms`.
bool wait_until_asleep(const std::function<std::vector<std::string>()>& stat_paths,
                       int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool slept_before = false;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto paths = stat_paths();
    const bool asleep =
        !paths.empty() && std::all_of(paths.begin(), paths.end(), [](const std::string& path) {
          return sleeps(path);
        });
    if (asleep && slept_before) return true;
    slept_before = asleep;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

bool wait_until_blocked(int pid, int timeout_ms) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  return wait_until_asleep(
      [&] {
        std::vector<std::string> paths;
        for (const auto& thread : list_directory(tasks)) {
          paths.push_back(tasks + "/" + thread + "/stat");
        }
        return paths;
      },
      timeout_ms);
}

bool wait_until_thread_blocked(int tid, int timeout_ms) {
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/stat";
  return wait_until_asleep([&] { return std::vector<std::string>{path}; }, timeout_ms);
}

std::string dptrain_binary() { return DPTRAIN_BINARY; }

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    throw std::runtime_error("cannot find a free port");
  }
  const int port = ntohs(address.sin_port);
  close(fd);
  return port;
}

ChildProcess spawn_command(const std::vector<std::string>& args,
                           const std::map<std::string, std::string>& extra_env,
                           const std::string& log_prefix) {
  ChildProcess child;
  child.out_path = log_prefix + ".out";
  child.err_path = log_prefix + ".err";
  const int out = open(child.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = open(child.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out < 0 || err < 0) throw std::runtime_error("cannot create " + log_prefix + ".out/.err");
  const pid_t pid = start_child(args, extra_env, out, err, {out, err});
  close(out);
  close(err);
  child.pid = pid;
  return child;
}

CommandResult wait_command(const ChildProcess& child, int timeout_seconds) {
  CommandResult result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  int status = 0;
  while (true) {
    const pid_t done = waitpid(child.pid, &status, WNOHANG);
    if (done == child.pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      result.timed_out = true;
      kill(-child.pid, SIGKILL);
      waitpid(child.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  result.exit_code = exit_code_of(status);
  const auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  result.out = slurp(child.out_path);
  result.err = slurp(child.err_path);
  return result;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> list_directory(const std::string& directory) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(directory.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> temporary_files_in(const std::string& directory) {
  std::vector<std::string> temporaries;
  for (const auto& name : list_directory(directory)) {
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      temporaries.push_back(name);
    }
  }
  return temporaries;
}

}  // namespace dptrain::testing
