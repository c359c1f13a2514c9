// Naming, parsing and checking the devices replicas run on: "cpu", "cuda:0", ...
// Not here: what runs on them.
#pragma once

#include <torch/types.h>

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

// The intra-op threads a process takes when --threads is not given: OMP_NUM_THREADS when it is
// set (LibTorch has applied it already; torchrun sets it to 1 when it starts several processes
// on one host), else one per physical core among usable_cpu_cores() (a second hyperthread of a
// core only competes for the same vector units). Not LibTorch's own default: Debian's 1.13
// starts OpenMP with one thread. `omp_num_threads` is the variable's value, or null.
int default_intra_op_threads(const char* omp_num_threads);

// Waits for the device's queued work, so that a clock reading means what it says.
void synchronize(const torch::Device& device);

// The GPU behind a CUDA device, the same in every process that sees it whatever its index
// there (CUDA_VISIBLE_DEVICES renumbers): "GPU-" and its UUID. "" for the CPU, or in a build
// without CUDA.
std::string gpu_identity(const torch::Device& device);

// This machine's name, as gethostname() gives it ("localhost" when that fails).
std::string host_name();

}  // namespace dptrain
