// Naming, parsing and checking the devices replicas run on: "cpu", "cuda:0", ...
// Not here: what runs on them.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

namespace dptrain {

// Parses a comma list such as "cpu,cpu" or "cuda:0,cuda:1"; "cuda" means cuda:0. Throws
// UsageError naming the bad entry, or a CUDA device this machine does not have.
std::vector<torch::Device> parse_device_list(const std::string& list);

// cuda:0 .. cuda:(count-1); a UsageError when fewer GPUs exist.
std::vector<torch::Device> first_gpus(int count);

// The first GPU when there is one, else the CPU.
std::vector<torch::Device> default_devices();

int cuda_device_count();

// "cpu", "cuda:0"
std::string device_name(const torch::Device& device);
// "[cpu]", "[cuda:0, cuda:1]"
std::string device_list_name(const std::vector<std::string>& names);

// Waits for the device's queued work, so that a clock reading means what it says.
void synchronize(const torch::Device& device);

// The GPU behind a CUDA device, the same in every process that sees it whatever its index
// there (CUDA_VISIBLE_DEVICES renumbers): "GPU-" and its UUID. "" for the CPU, or in a build
// without CUDA.
std::string gpu_identity(const torch::Device& device);

// This machine's name, as gethostname() gives it ("localhost" when that fails).
std::string host_name();

}  // namespace dptrain
