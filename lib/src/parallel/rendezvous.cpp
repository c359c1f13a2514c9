// Launcher environments, stores and the bounded store barrier. See rendezvous.h.
#include "dptrain/parallel/rendezvous.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"

extern char** environ;

namespace dptrain {
namespace {

using Env = std::map<std::string, std::string>;

std::optional<std::string> lookup(const Env& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

int parse_env_int(const Env& env, const std::string& name, int min_value, int max_value) {
  auto value = lookup(env, name);
  if (!value) throw UsageError("environment: " + name + " is not set");
  if (value->find_first_not_of("0123456789") != std::string::npos || value->size() > 9) {
    throw UsageError("environment: " + name + "=" + *value + " is not a non-negative integer");
  }
  const int parsed = std::stoi(*value);
  if (parsed < min_value || parsed > max_value) {
    throw UsageError("environment: " + name + "=" + *value + " is outside " +
                     std::to_string(min_value) + ".." + std::to_string(max_value));
  }
  return parsed;
}

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string from_bytes(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace

namespace {

// Note [The batch step is no launch]
// Inside an sbatch script, outside srun, Slurm sets SLURM_PROCID=0 and SLURM_NTASKS=N for the
// batch step: a plain run there would be rank 0 of N, waiting for ranks that never come. Slurm's
// own tools tell a job step started by srun by SLURM_STEP_ID: a number for an srun step; unset,
// "batch"/"extern"/"interactive", or one of the reserved ids from 0xfffffff0 up (4294967294 is
// the batch script, 4294967290 salloc's interactive step) otherwise. The step's own task count
// is SLURM_STEP_NUM_TASKS (SLURM_NTASKS is the job's, which an srun -n smaller than the job's
// does not change).
bool in_srun_step(const Env& env) {
  const auto step = lookup(env, "SLURM_STEP_ID") ? lookup(env, "SLURM_STEP_ID")
                                                 : lookup(env, "SLURM_STEPID");
  if (!step || step->size() > 10 || step->find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  return std::stoull(*step) < 0xfffffff0ULL;
}

// The tasks of this step on this node: SLURM_STEP_TASKS_PER_NODE is one count per node, runs of
// equal counts written "2(x3)", e.g. "2(x3),1" for nodes 0..3; SLURM_NODEID picks this node's.
// 0 when it cannot be read.
int slurm_tasks_on_this_node(const Env& env) {
  const auto list = lookup(env, "SLURM_STEP_TASKS_PER_NODE")
                        ? lookup(env, "SLURM_STEP_TASKS_PER_NODE")
                        : lookup(env, "SLURM_TASKS_PER_NODE");
  const auto node_text = lookup(env, "SLURM_NODEID").value_or("0");
  if (!list || node_text.size() > 6 ||
      node_text.find_first_not_of("0123456789") != std::string::npos) {
    return 0;
  }
  long node = std::stol(node_text);
  std::istringstream runs(*list);
  std::string run;
  while (std::getline(runs, run, ',')) {
    long count = 0, repeat = 1;
    char open = 0, x = 0;
    std::istringstream parts(run);
    if (!(parts >> count) || count < 1 || count > (1 << 20)) return 0;
    if (parts >> open) {
      if (open != '(' || !(parts >> x >> repeat) || x != 'x' || repeat < 1) return 0;
    }
    if (node < repeat) return static_cast<int>(count);
    node -= repeat;
  }
  return 0;
}

// "RANK=0, WORLD_SIZE=2": the variables that made this process a rank, for its errors.
std::string shown_variables(const Env& env, std::initializer_list<const char*> names) {
  std::string shown;
  for (const char* name : names) {
    if (const auto value = lookup(env, name)) {
      shown +=
          (shown.empty() ? "" : ", ") + std::string(name) + "=" + printable(value->substr(0, 40));
    }
  }
  return shown;
}

std::optional<LaunchEnvironment> read_launch_environment_unexplained(const Env& env,
                                                                     const std::string& because) {
  LaunchEnvironment launch;
  std::string rank_var, size_var, local_var;
  if (lookup(env, "RANK") || lookup(env, "WORLD_SIZE")) {
    launch.launcher = "torchrun";
    rank_var = "RANK", size_var = "WORLD_SIZE", local_var = "LOCAL_RANK";
  } else {
    launch.launcher = "slurm";
    rank_var = "SLURM_PROCID", local_var = "SLURM_LOCALID";
    size_var = lookup(env, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  }
  constexpr int kMaxWorld = 1 << 20;
  launch.world_size = parse_env_int(env, size_var, 1, kMaxWorld);
  launch.rank = parse_env_int(env, rank_var, 0, launch.world_size - 1);
  launch.local_rank = lookup(env, local_var) ? parse_env_int(env, local_var, 0, kMaxWorld) : 0;
  auto addr = lookup(env, "MASTER_ADDR");
  if (!addr) {
    throw UsageError("environment: MASTER_ADDR is not set (" + launch.launcher + " launch, rank " +
                     std::to_string(launch.rank) + ", from " + because +
                     "); set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port");
  }
  launch.master_addr = *addr;
  launch.master_port = parse_env_int(env, "MASTER_PORT", 1, 65535);
  launch.agent_store = lookup(env, "TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (lookup(env, "TORCHELASTIC_RESTART_COUNT")) {
    launch.restart_count = parse_env_int(env, "TORCHELASTIC_RESTART_COUNT", 0, kMaxWorld);
  }
  const bool loopback = launch.master_addr == "127.0.0.1" || launch.master_addr == "localhost" ||
                        launch.master_addr == "::1";
  if (launch.launcher == "torchrun" && lookup(env, "LOCAL_WORLD_SIZE")) {
    launch.local_world_size = parse_env_int(env, "LOCAL_WORLD_SIZE", 1, kMaxWorld);
  } else if (const int here = launch.launcher == "slurm" ? slurm_tasks_on_this_node(env) : 0;
             here > 0) {
    launch.local_world_size = here;
  } else if (loopback) {
    launch.local_world_size = launch.world_size;  // every rank meets on this machine
  }
  return launch;
}

}  // namespace

std::optional<LaunchEnvironment> read_launch_environment(const Env& env) {
  std::string because;
  if (lookup(env, "RANK") || lookup(env, "WORLD_SIZE")) {
    because = shown_variables(env, {"RANK", "WORLD_SIZE", "LOCAL_RANK"});
  } else if (lookup(env, "SLURM_PROCID") && in_srun_step(env)) {
    because = shown_variables(env, {"SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID",
                                    "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"});
  } else {
    return std::nullopt;  // no launcher, or an sbatch script's batch step
  }
  try {
    return read_launch_environment_unexplained(env, because);
  } catch (const UsageError& e) {
    const std::string what = e.what();
    if (what.find(because) != std::string::npos) throw;  // the message names them already
    throw UsageError(what + " (this process is a rank because of " + because + ")");
  }
}

std::optional<LaunchEnvironment> read_launch_environment() {
  Env env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string text = *entry;
    const auto eq = text.find('=');
    if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
  }
  return read_launch_environment(env);
}

c10::intrusive_ptr<c10d::Store> make_in_process_store(std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(timeout);
  return store;
}

void check_master_address(const LaunchEnvironment& launch) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;  // IPv4 or IPv6, as LibTorch's socket code tries both
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(launch.master_port);
  const int status = ::getaddrinfo(launch.master_addr.c_str(), port.c_str(), &hints, &found);
  if (found) ::freeaddrinfo(found);
  if (status == 0) return;
  throw CollectiveError("rank " + std::to_string(launch.rank) + ": MASTER_ADDR=" +
                        launch.master_addr + " does not resolve (" + ::gai_strerror(status) +
                        "); it must name the machine of rank 0, e.g. its host name or IP address");
}

namespace {

// Whether something accepts a TCP connection at `address` within `wait`.
bool accepts_connection(const addrinfo& address, std::chrono::milliseconds wait) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                          address.ai_protocol);
  if (fd < 0) return false;
  bool connected = ::connect(fd, address.ai_addr, address.ai_addrlen) == 0;
  if (!connected && errno == EINPROGRESS) {
    pollfd waiting{fd, POLLOUT, 0};
    int error = 0;
    socklen_t length = sizeof error;
    connected = ::poll(&waiting, 1, static_cast<int>(wait.count())) == 1 &&
                ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
  }
  ::close(fd);
  return connected;
}

}  // namespace

// Note [A client waits for the store quietly]
// LibTorch's TCPStore client retries a refused connection itself, and logs a W... socket.cpp
// line for every retry, before dptrain can say anything. So a connecting rank first waits,
// with a probe of its own, until something accepts connections at MASTER_ADDR:MASTER_PORT;
// LibTorch's client then connects at once. Nothing listening within the timeout is one line.
void wait_for_store_server(const LaunchEnvironment& launch, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(launch.master_port);
  if (::getaddrinfo(launch.master_addr.c_str(), port.c_str(), &hints, &found) != 0) {
    return;  // check_master_address names it
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool listening = false;
  while (!listening) {
    for (const addrinfo* a = found; a != nullptr && !listening; a = a->ai_next) {
      listening = accepts_connection(*a, std::chrono::milliseconds(500));
    }
    if (listening || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(found);
  if (listening) return;
  throw CollectiveError("rank " + std::to_string(launch.rank) + ": rendezvous at " +
                        launch.master_addr + ":" + port +
                        " (connecting) failed: nothing accepted a connection there within " +
                        std::to_string(timeout.count() / 1000) +
                        " s (--timeout); is rank 0 (or torchrun's agent) running there, with "
                        "this MASTER_PORT?");
}

// Note [The serving rank binds first]
// LibTorch's server tries [::] and then 0.0.0.0 on MASTER_PORT and, when neither binds, logs a
// W and an E socket.cpp line of its own before it throws: the user read three lines of LibTorch
// before dptrain's. The serving rank therefore tries the same binds itself first (with
// SO_REUSEADDR, as LibTorch does, so a closed store's TIME_WAIT does not count): a port that
// another process listens on is one line that says what may hold it, another program or a second
// process started as rank 0. The race with a process that takes the port in between is left to
// LibTorch's own message. Both 1.13 and 2.x bind every interface: TCPStoreOptions has no address
// to bind (2.x takes an already bound socket, masterListenFd, which 1.13 lacks): docs/running.md.
void check_store_port_free(const LaunchEnvironment& launch) {
  int error = 0;
  for (const int family : {AF_INET6, AF_INET}) {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_storage address{};
    socklen_t length = 0;
    if (family == AF_INET6) {
      auto* any6 = reinterpret_cast<sockaddr_in6*>(&address);
      any6->sin6_family = AF_INET6;
      any6->sin6_addr = in6addr_any;
      any6->sin6_port = htons(static_cast<uint16_t>(launch.master_port));
      length = sizeof *any6;
    } else {
      auto* any4 = reinterpret_cast<sockaddr_in*>(&address);
      any4->sin_family = AF_INET;
      any4->sin_addr.s_addr = htonl(INADDR_ANY);
      any4->sin_port = htons(static_cast<uint16_t>(launch.master_port));
      length = sizeof *any4;
    }
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0;
    if (!bound) error = errno;
    ::close(fd);
    if (bound) return;  // LibTorch will bind this family too
  }
  if (error != EADDRINUSE && error != EACCES) return;  // LibTorch says what else went wrong
  const std::string where = "rank " + std::to_string(launch.rank) + ": rendezvous at " +
                            launch.master_addr + ":" + std::to_string(launch.master_port) +
                            " (serving) failed: ";
  if (error == EACCES) {
    throw CollectiveError(where + "MASTER_PORT " + std::to_string(launch.master_port) +
                          " needs privileges this process lacks (ports below 1024); choose a "
                          "MASTER_PORT from 1024 to 65535");
  }
  throw CollectiveError(where + "MASTER_PORT " + std::to_string(launch.master_port) +
                        " is already in use on this machine: by another program, or by another "
                        "process started as rank 0 of this world (RANK=0 given twice?); end it, "
                        "or choose a free MASTER_PORT");
}

c10::intrusive_ptr<c10d::Store> connect_tcp_store(const LaunchEnvironment& launch,
                                                  std::chrono::milliseconds timeout) {
  check_master_address(launch);
  const bool serving = launch.rank == 0 && !launch.agent_store;
  if (serving) check_store_port_free(launch);
  if (!serving) wait_for_store_server(launch, timeout);
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(launch.master_port);
  options.isServer = launch.rank == 0 && !launch.agent_store;
  options.numWorkers = launch.world_size;
  // LibTorch 1.13's server returns silently when workers never come, 2.x throws; we wait for
  // the workers ourselves in store_barrier, which behaves the same on both.
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, options);
    return c10::make_intrusive<c10d::PrefixStore>(
        "dptrain/attempt" + std::to_string(launch.restart_count), std::move(store));
  } catch (const std::exception& e) {
    std::string reason = e.what();
    if (const auto newline = reason.find('\n'); newline != std::string::npos)
      reason.resize(newline);
    throw CollectiveError("rank " + std::to_string(launch.rank) + ": rendezvous at " +
                          launch.master_addr + ":" + std::to_string(launch.master_port) + " (" +
                          (options.isServer ? "serving" : "connecting") + ") failed: " + reason);
  }
}

std::vector<int> ranks_missing_after(c10d::Store& store, const std::string& prefix, int world_size,
                                     std::chrono::milliseconds timeout) {
  auto check_ins = poll_check_ins(store, prefix, world_size, timeout);
  if (!check_ins.store_error.empty()) throw std::runtime_error(check_ins.store_error);
  return check_ins.missing;
}

CheckIns poll_check_ins(c10d::Store& store, const std::string& prefix, int world_size,
                        std::chrono::milliseconds timeout) {
  // Poll rather than Store::wait: on timeout we want to say which ranks are missing, and the
  // store's own wait only says that it timed out.
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  CheckIns seen;
  bool one_round = false;
  while (true) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < world_size; ++r) {
        if (!store.check({prefix + std::to_string(r)})) missing.push_back(r);
      }
    } catch (const std::exception& e) {
      // A store that served a full round and then failed was taken down while we watched
      // (rank 0, or torchrun's agent, ending on its own error): the last round still says
      // who had not checked in by then.
      if (!one_round) throw;
      seen.store_error = e.what();
      return seen;
    }
    one_round = true;
    seen.missing = std::move(missing);
    seen.polled =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    if (seen.missing.empty() || std::chrono::steady_clock::now() >= deadline) return seen;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string list;
  for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
  return list;
}

static void store_barrier_unguarded(c10d::Store& store, const std::string& name, int rank,
                                    int world_size, std::chrono::milliseconds timeout);

void store_barrier(c10d::Store& store, const std::string& name, int rank, int world_size,
                   std::chrono::milliseconds timeout) {
  try {
    store_barrier_unguarded(store, name, rank, world_size, timeout);
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    // The store's own errors ("Broken pipe", "Connection reset") do not say whose store it is.
    std::string reason = e.what();
    reason.resize(std::min(reason.size(), reason.find('\n')));
    throw CollectiveError("rank " + std::to_string(rank) + ": " + name +
                          " lost the rendezvous store (" + reason +
                          "); the rank serving it, rank 0, has probably exited");
  }
}

namespace {

const std::string kClaimPrefix = "dptrain/claim/rank/";

// "; rank 1 was claimed by 2 processes (...)": the ranks that two processes took, which is why
// others never came; "" when none (or the store cannot say).
std::string ranks_claimed_twice(c10d::Store& store, int world_size) {
  std::vector<int> twice;
  try {
    for (int r = 0; r < world_size && twice.size() < 8; ++r) {
      const std::string key = kClaimPrefix + std::to_string(r);
      if (store.check({key}) && store.add(key, 0) > 1) twice.push_back(r);
    }
  } catch (const std::exception&) {
    return "";
  }
  if (twice.empty()) return "";
  return "; rank(s) " + rank_list(twice) +
         " were started in two processes each (the same RANK given twice?), so the ranks "
         "left without a process never came";
}

}  // namespace

void claim_rank(c10d::Store& store, int rank) {
  const auto claims = store.add(kClaimPrefix + std::to_string(rank), 1);
  if (claims <= 1) return;
  throw CollectiveError("rank " + std::to_string(rank) + ": another process has already joined " +
                        "this rendezvous as rank " + std::to_string(rank) +
                        " (the same RANK, or SLURM_PROCID, given to two processes?); every "
                        "process needs its own rank from 0 to WORLD_SIZE-1");
}

static void store_barrier_unguarded(c10d::Store& store, const std::string& name, int rank,
                                    int world_size, std::chrono::milliseconds timeout) {
  const std::string prefix = "dptrain/barrier/" + name + "/rank/";
  store.set(prefix + std::to_string(rank), to_bytes(std::to_string(world_size)));
  const auto missing = ranks_missing_after(store, prefix, world_size, timeout);
  if (!missing.empty()) {
    throw CollectiveError("rank " + std::to_string(rank) + ": " + name + " timed out after " +
                          std::to_string(timeout.count() / 1000.0).substr(0, 5) + " s: rank(s) " +
                          rank_list(missing) + " of " + std::to_string(world_size) +
                          " never arrived" + ranks_claimed_twice(store, world_size));
  }
  for (int r = 0; r < world_size; ++r) {
    const auto their_size = from_bytes(store.get(prefix + std::to_string(r)));
    if (their_size != std::to_string(world_size)) {
      throw CollectiveError("rank " + std::to_string(rank) + ": rank " + std::to_string(r) +
                            " was started with world size " + their_size + ", this rank with " +
                            std::to_string(world_size));
    }
  }
}

std::vector<std::string> all_gather_strings(c10d::Store& store, const std::string& key, int rank,
                                            int world_size, const std::string& value,
                                            std::chrono::milliseconds timeout) {
  const std::string prefix = "dptrain/gather/" + key + "/";
  store.set(prefix + std::to_string(rank), to_bytes(value));
  store_barrier(store, "gather " + key, rank, world_size, timeout);
  std::vector<std::string> values;
  for (int r = 0; r < world_size; ++r)
    values.push_back(from_bytes(store.get(prefix + std::to_string(r))));
  return values;
}

std::vector<RankPlacement> gather_placements(c10d::Store& store, int rank, int world_size,
                                             const RankPlacement& mine,
                                             std::chrono::milliseconds timeout) {
  // Host names, device names and UUIDs hold no newline, so one line per field is unambiguous.
  const auto texts = all_gather_strings(store, "placements", rank, world_size,
                                        mine.host + "\n" + mine.device + "\n" + mine.gpu, timeout);
  std::vector<RankPlacement> placements;
  for (const auto& text : texts) {
    const auto first = text.find('\n');
    const auto second = first == std::string::npos ? first : text.find('\n', first + 1);
    if (second == std::string::npos) {
      throw CollectiveError("rank " + std::to_string(rank) +
                            ": a peer published a malformed placement (another program, or "
                            "another version of dptrain, on the same rendezvous?)");
    }
    placements.push_back(RankPlacement{text.substr(0, first),
                                       text.substr(first + 1, second - first - 1),
                                       text.substr(second + 1)});
  }
  return placements;
}

}  // namespace dptrain
