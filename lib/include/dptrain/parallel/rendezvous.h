// How ranks find each other: the launcher's environment (torchrun or Slurm), the store they meet
// in (in memory for thread ranks, c10d's TCPStore across processes), and a bounded barrier that
// names the ranks that did not come. Not here: the process groups built on the store.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace dptrain {

// One process's place in a multi-process world, as a launcher describes it.
struct LaunchEnvironment {
  std::string launcher;  // "torchrun" or "slurm", for messages
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // The ranks on this host, which share its cores: torchrun's LOCAL_WORLD_SIZE, Slurm's tasks of
  // this step on this node (SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID), else the whole world
  // when MASTER_ADDR is a loopback address (every rank is here), else 1 (not known).
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  // torchrun's agent already serves a TCPStore at MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True); every rank is then its client.
  bool agent_store = false;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: keys of earlier attempts are ignored
};

// Reads torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, else those of a
// Slurm job step started by srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS and SLURM_LOCALID (with
// MASTER_ADDR/MASTER_PORT). Returns nullopt when neither launcher is present; an sbatch script's
// own batch step (SLURM_PROCID=0 and SLURM_NTASKS set, but no numeric SLURM_STEP_ID) is no
// launch, as it is for Slurm's own tools. Throws UsageError on an incomplete or malformed set,
// naming the variable and the variables that made this process a rank. `env` maps variable
// names to values (tests pass their own).
std::optional<LaunchEnvironment> read_launch_environment(
    const std::map<std::string, std::string>& env);
// The same, from this process's environment.
std::optional<LaunchEnvironment> read_launch_environment();

// Waits until something accepts TCP connections at MASTER_ADDR:MASTER_PORT, so that LibTorch's
// client connects at once instead of logging each retry; CollectiveError naming the address
// after `timeout`. connect_tcp_store calls it on every rank that does not serve the store.
void wait_for_store_server(const LaunchEnvironment& launch, std::chrono::milliseconds timeout);

// A store in memory, for ranks that are threads of one process.
c10::intrusive_ptr<c10d::Store> make_in_process_store(std::chrono::milliseconds timeout);

// Resolves MASTER_ADDR as the store will (getaddrinfo). A name that does not resolve would
// otherwise have LibTorch retry it for the whole timeout, logging each try, and then report a
// timeout; here it is a CollectiveError naming the variable and the host at once. An address
// that resolves but does not answer (a machine that is down, a firewall) can only be told from
// a slow one by waiting: that still takes the timeout.
void check_master_address(const LaunchEnvironment& launch);

// Rank 0 serves a TCPStore on MASTER_PORT (unless torchrun's agent does), the others connect to
// MASTER_ADDR (checked first with check_master_address), all bounded by `timeout`. The store
// returned puts dptrain's keys under a prefix of their own. Throws CollectiveError naming the
// address and the cause.
c10::intrusive_ptr<c10d::Store> connect_tcp_store(const LaunchEnvironment& launch,
                                                  std::chrono::milliseconds timeout);

// Takes `rank` in the store, once: a second process that claims the same rank is a
// CollectiveError at once, naming it (a duplicate RANK otherwise looks like a rank that never
// came, and for rank 0 like a port held by another program). store_barrier's timeout names the
// ranks claimed twice.
void claim_rank(c10d::Store& store, int rank);

// Every rank announces itself under `name` and waits for the others. On timeout, throws
// CollectiveError listing the ranks that never arrived. Also checks that every rank agrees on
// the world size.
void store_barrier(c10d::Store& store, const std::string& name, int rank, int world_size,
                   std::chrono::milliseconds timeout);

// Waits until the key `prefix` + r exists for every rank r < world_size, or `timeout` passes.
// Returns the ranks whose key is still missing: empty when all came.
std::vector<int> ranks_missing_after(c10d::Store& store, const std::string& prefix, int world_size,
                                     std::chrono::milliseconds timeout);

// What a poll for check-ins saw before it ended. When the store failed after at least one full
// round, `store_error` holds its message and `missing` that round's answer; a store that fails
// in the first round throws, as in ranks_missing_after.
struct CheckIns {
  std::vector<int> missing;
  std::string store_error;
  std::chrono::milliseconds polled{0};  // from the start to the last full round
};

// ranks_missing_after that keeps what it learnt when the store goes away mid-poll.
CheckIns poll_check_ins(c10d::Store& store, const std::string& prefix, int world_size,
                        std::chrono::milliseconds timeout);

// "1, 2" for {1, 2}: ranks as error messages list them.
std::string rank_list(const std::vector<int>& ranks);

// Each rank publishes `value` under `key`; returns all ranks' values in rank order.
std::vector<std::string> all_gather_strings(c10d::Store& store, const std::string& key, int rank,
                                            int world_size, const std::string& value,
                                            std::chrono::milliseconds timeout);

// Where one rank runs, as every rank learns it at the rendezvous.
struct RankPlacement {
  std::string host;    // the machine's name
  std::string device;  // as that process names it: "cpu", "cuda:0"
  std::string gpu;     // the GPU's identity across processes ("GPU-" and its UUID); "" for cpu
};

// The rendezvous exchange of placements: each rank publishes its own, and gets every rank's in
// rank order. One round through the store; a rank that never publishes is a CollectiveError
// naming it (store_barrier).
std::vector<RankPlacement> gather_placements(c10d::Store& store, int rank, int world_size,
                                             const RankPlacement& mine,
                                             std::chrono::milliseconds timeout);

}  // namespace dptrain
