// Device lists for --devices and --gpus. See devices.h.
#include "dptrain/core/devices.h"

#include <ATen/Parallel.h>
#include <sched.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#if defined(DPTRAIN_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include "dptrain/core/errors.h"

namespace dptrain {

int cuda_device_count() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

namespace {

torch::Device parse_one_device(const std::string& text, int available) {
  if (text == "cpu") return torch::Device(torch::kCPU);
  if (text.rfind("cuda", 0) != 0) {
    throw UsageError("--devices: '" + text + "' is not a device; expected cpu or cuda:N");
  }
  int index = 0;
  if (text != "cuda") {
    const std::string number = text.size() > 5 && text[4] == ':' ? text.substr(5) : "";
    if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos ||
        number.size() > 4) {
      throw UsageError("--devices: '" + text + "' is not a device; expected cpu or cuda:N");
    }
    index = std::stoi(number);
  }
  if (available == 0) {
    throw UsageError("--devices: '" + text +
                     "' needs CUDA, but this machine (or this build of LibTorch) has no GPU");
  }
  if (index >= available) {
    throw UsageError("--devices: '" + text + "' does not exist; this machine has " +
                     std::to_string(available) +
                     " GPU(s), cuda:0 to cuda:" + std::to_string(available - 1));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

std::vector<torch::Device> parse_device_list(const std::string& list, int cuda_devices) {
  std::vector<torch::Device> devices;
  if (!list.empty() && list.back() == ',') {
    throw UsageError("--devices: empty entry in '" + list + "'");
  }
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const auto first = item.find_first_not_of(' ');
    const auto last = item.find_last_not_of(' ');
    item = first == std::string::npos ? "" : item.substr(first, last - first + 1);
    if (item.empty()) throw UsageError("--devices: empty entry in '" + list + "'");
    devices.push_back(parse_one_device(item, cuda_devices));
  }
  if (devices.empty()) throw UsageError("--devices: no device given");
  return devices;
}

std::vector<torch::Device> first_gpus(int count, int available) {
  if (count <= 0) throw UsageError("--gpus: must be at least 1, got " + std::to_string(count));
  if (available < count) {
    throw UsageError("--gpus " + std::to_string(count) + ": this machine has " +
                     std::to_string(available) + " usable GPU(s)" +
                     (available == 0 ? " (no CUDA device or a CPU-only LibTorch)" : ""));
  }
  std::vector<torch::Device> devices;
  for (int i = 0; i < count; ++i) {
    devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
  }
  return devices;
}

std::string device_name(const torch::Device& device) {
  if (device.is_cuda()) return "cuda:" + std::to_string(device.has_index() ? device.index() : 0);
  return device.str();
}

std::string device_list_name(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out + "]";
}

int usable_cpu_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) > 0) {
    return CPU_COUNT(&mask);
  }
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);  // more CPUs than a cpu_set_t holds
  return online > 0 ? static_cast<int>(online) : 1;
}

namespace {

// Distinct (package, core) pairs among the CPUs in this process's affinity mask, from sysfs; 0
// when the topology cannot be read (some containers hide it).
int usable_physical_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) return 0;
  std::set<std::pair<long, long>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    const std::string topology = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream package(topology + "physical_package_id"), core(topology + "core_id");
    long package_id = 0, core_id = 0;
    if (!(package >> package_id) || !(core >> core_id)) return 0;
    cores.emplace(package_id, core_id);
  }
  return static_cast<int>(cores.size());
}

}  // namespace

int default_intra_op_threads(const char* omp_num_threads) {
  if (omp_num_threads && *omp_num_threads) return std::max(1, at::get_num_threads());
  const int physical = usable_physical_cores();
  return physical > 0 ? physical : usable_cpu_cores();
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : 0);
}

std::string gpu_identity(const torch::Device& device) {
#if defined(DPTRAIN_WITH_CUDA)
  if (device.is_cuda()) {
    const auto* properties = at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    std::string uuid = "GPU-";
    char hex[3];
    for (int i = 0; i < 16; ++i) {
      std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(properties->uuid.bytes[i]));
      uuid += hex;
      if (i == 3 || i == 5 || i == 7 || i == 9) uuid += '-';
    }
    return uuid;
  }
#endif
  (void)device;
  return "";
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace dptrain
