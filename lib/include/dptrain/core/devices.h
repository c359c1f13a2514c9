// Naming, parsing and checking the devices replicas run on: "cpu", "cuda:0", ...; the host's
// facts (cores, quota, name) and the memory peaks of the process and its devices.
// Not here: what runs on them, or what a device can compute (peak_tflops.h).
#pragma once

#include <torch/types.h>

#include <optional>
#include <string>
#include <vector>

namespace dptrain {

// The number of GPUs this process can use: 0 without CUDA or with a CPU-only LibTorch.
int cuda_device_count();

// Parses a comma list such as "cpu,cpu" or "cuda:0,cuda:1"; "cuda" means cuda:0. Throws
// UsageError naming the bad entry, or a CUDA device beyond the machine's `cuda_devices`.
std::vector<torch::Device> parse_device_list(const std::string& list, int cuda_devices);

// cuda:0 .. cuda:(count-1); a UsageError when the machine has fewer than `count`.
std::vector<torch::Device> first_gpus(int count, int cuda_devices);

// "cpu", "cuda:0"
std::string device_name(const torch::Device& device);
// "[cpu]", "[cuda:0, cuda:1]"
std::string device_list_name(const std::vector<std::string>& names);

// The CPUs this process may run on (its affinity mask: a container or taskset may allow fewer
// than the machine has); at least 1.
int usable_cpu_cores();

// The whole cores of CPU time this process's cgroup may use: the smallest quota over its cgroup
// and the cgroups above it (v2 cpu.max "quota period", v1 cpu.cfs_quota_us / cpu.cfs_period_us),
// rounded down, at least 1; nullopt when no quota is set or none can be read. A container started
// with `docker --cpus 2` sees every core in its affinity mask but gets two cores' time.
// `cgroup_root` is where the cgroup filesystems are mounted (/sys/fs/cgroup) and `proc_cgroup`
// the text of /proc/self/cgroup; tests pass a fake tree.
std::optional<int> cgroup_cpu_quota(const std::string& cgroup_root, const std::string& proc_cgroup);
// The same for this process.
std::optional<int> cgroup_cpu_quota();

// The intra-op threads a process takes when --threads is not given, and where the figure came
// from, for the run's first line.
struct ThreadDefault {
  int threads = 1;
  std::string reason;  // "2 threads (8 cores, quota 4, / 2 local ranks)"
};

// The host's usable cores shared among the processes on it: min(`cores`, `quota`) divided by
// `local_ranks` (rounded down, at least 1 each). The arithmetic of default_intra_op_threads.
ThreadDefault share_cores(int cores, std::optional<int> quota, int local_ranks);

// The default: OMP_NUM_THREADS when it is set (LibTorch has applied it already; torchrun sets it
// to 1 when it starts several processes on one host), else one per physical core among
// usable_cpu_cores() (a second hyperthread of a core only competes for the same vector units),
// capped by the cgroup's CPU quota and shared among the `local_ranks` processes on this host
// (torchrun's LOCAL_WORLD_SIZE, Slurm's tasks on this node; 1 without a launcher): two ranks
// that each took every core ran 5.3 times slower than with one thread each. Not LibTorch's own
// default: Debian's 1.13 starts OpenMP with one thread. `omp_num_threads` is the variable's
// value, or null.
ThreadDefault default_intra_op_threads(const char* omp_num_threads, int local_ranks = 1);

// Waits for the device's queued work, so that a clock reading means what it says.
void synchronize(const torch::Device& device);

// The GPU behind a CUDA device, the same in every process that sees it whatever its index
// there (CUDA_VISIBLE_DEVICES renumbers): "GPU-" and its UUID. "" for the CPU, or in a build
// without CUDA.
std::string gpu_identity(const torch::Device& device);

// This machine's name, as gethostname() gives it ("localhost" when that fails).
std::string host_name();

// The process's peak resident set size so far, in bytes (getrusage's ru_maxrss, which Linux
// gives in KiB): every replica of the process, the data and LibTorch's own memory included.
double peak_host_bytes();

// On CUDA, the largest number of bytes LibTorch's caching allocator has had allocated to tensors
// on `device` since the process started (its "allocated_bytes" peak: what the run's tensors
// needed at most, not the larger "reserved" figure that also counts the cache's free blocks).
// NaN on the CPU and in a build without CUDA.
double peak_device_bytes(const torch::Device& device);

}  // namespace dptrain
