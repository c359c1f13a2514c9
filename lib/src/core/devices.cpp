// Device lists for --devices and --gpus. See devices.h.
#include "dptrain/core/devices.h"

#include <ATen/Parallel.h>
#include <sched.h>
#include <sys/resource.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#if defined(DPTRAIN_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
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

namespace {

std::optional<long long> read_number(const std::string& path) {
  std::ifstream file(path);
  long long value = 0;
  if (file >> value) return value;
  return std::nullopt;
}

// The cores' worth of a quota over a period, rounded down, at least 1; nullopt for none.
std::optional<int> cores_of(std::optional<long long> quota, std::optional<long long> period) {
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return static_cast<int>(std::max<long long>(1, std::min<long long>(*quota / *period, 1 << 20)));
}

// cgroup v2's cpu.max: "max 100000" (no quota) or "quota period".
std::optional<int> read_cpu_max(const std::string& path) {
  std::ifstream file(path);
  std::string quota;
  long long period = 0;
  if (!(file >> quota >> period) || quota == "max") return std::nullopt;
  if (quota.empty() || quota.find_first_not_of("0123456789") != std::string::npos ||
      quota.size() > 18) {
    return std::nullopt;
  }
  return cores_of(std::stoll(quota), period);
}

// `base` + `path` and every directory above it up to `base`: a quota on a parent binds too.
std::vector<std::string> cgroup_and_parents(const std::string& base, std::string path) {
  std::vector<std::string> dirs;
  while (!path.empty() && path != "/") {
    dirs.push_back(base + path);
    const auto slash = path.rfind('/');
    path = slash == std::string::npos ? "" : path.substr(0, slash);
  }
  dirs.push_back(base);
  return dirs;
}

void keep_smaller(std::optional<int>& smallest, std::optional<int> quota) {
  if (quota && (!smallest || *quota < *smallest)) smallest = quota;
}

}  // namespace

// Note [The cgroup's CPU quota]
// A quota (docker --cpus, Kubernetes' limits.cpu) leaves the affinity mask whole: the process
// still sees every core, and the kernel throttles it once it has used its share of each period
// (100 ms). OpenMP threads that wait for each other at every parallel region then wait out the
// throttled ones: more threads than the quota's cores only slow a step. /proc/self/cgroup names
// this process's cgroup under each hierarchy ("0::/path" for v2, "3:cpu,cpuacct:/path" for v1);
// inside a container's cgroup namespace the path is "/" and the root directory is its own cgroup.
// A path that does not exist under the mount (a v1 container that sees its host's path) leaves
// the directories above it, ending at the mount's root, which is the container's.
std::optional<int> cgroup_cpu_quota(const std::string& cgroup_root,
                                    const std::string& proc_cgroup) {
  std::optional<int> smallest;
  std::istringstream lines(proc_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (controllers.empty()) {  // v2: the unified hierarchy, at the root or (hybrid) unified/
      std::ifstream unified_at_root(cgroup_root + "/cgroup.controllers");
      const std::string base = cgroup_root + (unified_at_root ? "" : "/unified");
      for (const auto& dir : cgroup_and_parents(base, path)) {
        keep_smaller(smallest, read_cpu_max(dir + "/cpu.max"));
      }
      continue;
    }
    std::istringstream names(controllers);
    std::string name;
    bool cpu = false;
    while (std::getline(names, name, ',')) cpu = cpu || name == "cpu";
    if (!cpu) continue;
    for (const auto& mount : {cgroup_root + "/" + controllers, cgroup_root + "/cpu"}) {
      for (const auto& dir : cgroup_and_parents(mount, path)) {
        keep_smaller(smallest, cores_of(read_number(dir + "/cpu.cfs_quota_us"),
                                        read_number(dir + "/cpu.cfs_period_us")));
      }
    }
  }
  return smallest;
}

std::optional<int> cgroup_cpu_quota() {
  std::ifstream file("/proc/self/cgroup");
  std::stringstream text;
  text << file.rdbuf();
  return cgroup_cpu_quota("/sys/fs/cgroup", text.str());
}

ThreadDefault share_cores(int cores, std::optional<int> quota, int local_ranks) {
  cores = std::max(1, cores);
  local_ranks = std::max(1, local_ranks);
  const int usable = quota ? std::max(1, std::min(cores, *quota)) : cores;
  ThreadDefault share;
  share.threads = std::max(1, usable / local_ranks);
  share.reason = std::to_string(share.threads) + (share.threads == 1 ? " thread (" : " threads (") +
                 std::to_string(cores) + (cores == 1 ? " core" : " cores");
  if (quota) share.reason += ", quota " + std::to_string(*quota);
  if (local_ranks > 1) share.reason += ", / " + std::to_string(local_ranks) + " local ranks";
  share.reason += ")";
  return share;
}

ThreadDefault default_intra_op_threads(const char* omp_num_threads, int local_ranks) {
  if (omp_num_threads && *omp_num_threads) {
    const int threads = std::max(1, at::get_num_threads());
    return {threads, std::to_string(threads) + (threads == 1 ? " thread" : " threads") +
                         " (OMP_NUM_THREADS)"};
  }
  const int physical = usable_physical_cores();
  return share_cores(physical > 0 ? physical : usable_cpu_cores(), cgroup_cpu_quota(),
                     local_ranks);
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

double peak_host_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(usage.ru_maxrss) * 1024.0;  // Linux gives KiB
}

double peak_device_bytes(const torch::Device& device) {
#if defined(DPTRAIN_WITH_CUDA)
  if (device.is_cuda()) {
    // The same call and fields in LibTorch 1.13 (c10::cuda::CUDACachingAllocator::DeviceStats)
    // and 2.x (c10::CachingDeviceAllocator::DeviceStats, which the CUDA namespace re-exports);
    // index 0 of each StatArray is StatType::AGGREGATE, all pools together, in both.
    const auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    return static_cast<double>(stats.allocated_bytes[0].peak);
  }
#else
  (void)device;
#endif
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace dptrain
