// LibTorch CPU allocators: caching (the default) and guarded (checks). See cpu_allocator.h.
#include "dptrain/core/cpu_allocator.h"

#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <new>
#include <stdexcept>

#include "dptrain/core/errors.h"

namespace dptrain {

namespace {

constexpr size_t kHeaderBytes = 64;  // keeps the data at LibTorch's 64-byte alignment
constexpr uint64_t kCheckWord = 0x6470747261696e21ULL;  // "dptrain!"

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

enum class BlockKind : uint32_t { kSmall = 1, kCached = 2, kGuarded = 3 };

}  // namespace

// In front of every block's data. The check words mix in the header's own address, so a header
// that was overwritten -- at its front by the block before it running over, at its back by this
// block's data running under -- or a pointer that never came from here fails the check on free.
struct alignas(kHeaderBytes) CpuBlockHeader {
  uint64_t front_check = 0;
  CachingCpuAllocator* owner = nullptr;  // null for guarded blocks
  size_t bytes = 0;                      // the block's length, header included
  void* mapping = nullptr;               // guarded blocks: the start of their mapping
  BlockKind kind = BlockKind::kSmall;
  uint32_t unused = 0;
  char padding[16] = {};
  uint64_t back_check = 0;  // the last 8 bytes before the data

  uint64_t expected_check() const { return kCheckWord ^ reinterpret_cast<uintptr_t>(this); }
  bool intact() const { return front_check == expected_check() && back_check == expected_check(); }
  void* data() { return reinterpret_cast<char*>(this) + kHeaderBytes; }
  static CpuBlockHeader* of(void* data) {
    return reinterpret_cast<CpuBlockHeader*>(static_cast<char*>(data) - kHeaderBytes);
  }
};
static_assert(sizeof(CpuBlockHeader) == kHeaderBytes);

namespace {

using Header = CpuBlockHeader;

// A header that fails its check means memory next to a tensor was overwritten: the process
// cannot go on safely, and unwinding from a deleter would terminate anyway.
[[noreturn]] void corrupted_header(const void* data) {
  std::fprintf(stderr,
               "error: the CPU allocator found the header of block %p overwritten: something "
               "wrote out of a tensor's bounds (run with --cpu-allocator guarded to find it)\n",
               data);
  std::fflush(stderr);
  ::_exit(70);
}

Header* checked_header(void* data) {
  Header* header = Header::of(data);
  if (!header->intact()) corrupted_header(data);
  return header;
}

Header* stamp(void* block, size_t bytes, BlockKind kind, CachingCpuAllocator* owner) {
  auto* header = new (block) Header;
  header->owner = owner;
  header->bytes = bytes;
  header->kind = kind;
  header->front_check = header->back_check = header->expected_check();
  return header;
}

// Cached blocks are mappings of their own, not glibc's, so that a block given back leaves the
// process: glibc would keep it in an arena, and the resident set would grow past the cache's
// bound (bench/results/2026-12-01-cpu-notes.md). Null when the system has no memory left.
void* map_pages(size_t bytes) {
  void* block = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return block == MAP_FAILED ? nullptr : block;
}

}  // namespace

std::string cpu_allocator_name(CpuAllocatorKind kind) {
  switch (kind) {
    case CpuAllocatorKind::kCaching:
      return "caching";
    case CpuAllocatorKind::kSystem:
      return "system";
    case CpuAllocatorKind::kGuarded:
      return "guarded";
  }
  return "caching";
}

CpuAllocatorKind parse_cpu_allocator(const std::string& name) {
  for (const auto kind :
       {CpuAllocatorKind::kCaching, CpuAllocatorKind::kSystem, CpuAllocatorKind::kGuarded}) {
    if (name == cpu_allocator_name(kind)) return kind;
  }
  throw UsageError("--cpu-allocator: '" + name +
                   "' is not an allocator; expected caching, system or guarded");
}

// ---- CachingCpuAllocator ----------------------------------------------------------------------

c10::DataPtr CachingCpuAllocator::allocate(size_t bytes) DPTRAIN_ALLOCATE_CONST {
  // allocate() is const in LibTorch 1.13's interface; the cache is this object's mutable state.
  void* data = const_cast<CachingCpuAllocator*>(this)->allocate_block(bytes);
  return {data, data, &CachingCpuAllocator::free_block, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr CachingCpuAllocator::raw_deleter() const {
  return &CachingCpuAllocator::free_block;
}

#if TORCH_VERSION_MAJOR >= 2
void CachingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}
#endif

void* CachingCpuAllocator::allocate_block(size_t bytes) {
  if (bytes > SIZE_MAX - kHeaderBytes - kRounding) {
    TORCH_CHECK(false, "CPU allocator: a tensor of ", bytes, " bytes cannot exist");
  }
  if (bytes < kCachedFrom) {
    return stamp(c10::alloc_cpu(bytes + kHeaderBytes), bytes + kHeaderBytes, BlockKind::kSmall,
                 this)
        ->data();
  }
  const size_t block_bytes = round_up(bytes + kHeaderBytes, kRounding);
  const auto size = static_cast<int64_t>(block_bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = free_by_size_.find(block_bytes);
    if (found != free_by_size_.end() && !found->second.empty()) {
      Header* header = *found->second.back();  // the most recently freed: warmest in cache
      free_by_age_.erase(found->second.back());
      found->second.pop_back();
      ++stats_.hits;
      stats_.cached_bytes -= size;
      stats_.live_bytes += size;
      stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
      return header->data();
    }
    // A miss. Give back the oldest blocks while the footprint would pass its bound.
    ++stats_.misses;
    stats_.live_bytes += size;
    stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
    while (stats_.cached_bytes > 0 &&
           stats_.live_bytes + stats_.cached_bytes > kFootprintPeaks * stats_.peak_live_bytes) {
      evict_oldest();
    }
  }
  void* block = map_pages(block_bytes);
  if (block == nullptr) {
    // Out of memory (or of address space): what the cache holds is not in use, so give it all
    // back and try once more before failing.
    release_cached();
    block = map_pages(block_bytes);
  }
  if (block == nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.live_bytes -= size;
    TORCH_CHECK(false, "CPU allocator: not enough memory for a tensor of ", bytes, " bytes (",
                stats_.live_bytes, " bytes in other tensors)");
  }
  return stamp(block, block_bytes, BlockKind::kCached, this)->data();
}

void CachingCpuAllocator::evict_oldest() {
  Header* oldest = free_by_age_.front();
  auto& same_size = free_by_size_[oldest->bytes];
  same_size.pop_front();  // the oldest of its size, as both lists are in the order of freeing
  free_by_age_.pop_front();
  stats_.cached_bytes -= static_cast<int64_t>(oldest->bytes);
  ++stats_.evictions;
  ::munmap(oldest, oldest->bytes);
}

void CachingCpuAllocator::recycle(CpuBlockHeader* header) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_by_age_.push_back(header);
  free_by_size_[header->bytes].push_back(std::prev(free_by_age_.end()));
  const auto size = static_cast<int64_t>(header->bytes);
  stats_.live_bytes -= size;
  stats_.cached_bytes += size;
}

void CachingCpuAllocator::free_block(void* data) {
  if (data == nullptr) return;
  Header* header = checked_header(data);
  switch (header->kind) {
    case BlockKind::kSmall:
      c10::free_cpu(header);
      return;
    case BlockKind::kCached:
      header->owner->recycle(header);
      return;
    case BlockKind::kGuarded:
      break;
  }
  corrupted_header(data);
}

CpuAllocatorStats CachingCpuAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingCpuAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!free_by_age_.empty()) evict_oldest();
  free_by_size_.clear();
}

// ---- GuardedCpuAllocator ----------------------------------------------------------------------

c10::DataPtr GuardedCpuAllocator::allocate(size_t bytes) DPTRAIN_ALLOCATE_CONST {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  TORCH_CHECK(bytes <= SIZE_MAX / 2, "CPU allocator: a tensor of ", bytes, " bytes cannot exist");
  const size_t data_bytes = round_up(std::max<size_t>(bytes, 1), kHeaderBytes);
  const size_t mapped = round_up(data_bytes + kHeaderBytes, page) + page;  // + the guard page
  void* mapping =
      ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(mapping != MAP_FAILED, "guarded CPU allocator: mmap of ", mapped,
              " bytes failed: ", std::strerror(errno));
  char* guard = static_cast<char*>(mapping) + mapped - page;
  TORCH_CHECK(::mprotect(guard, page, PROT_NONE) == 0,
              "guarded CPU allocator: mprotect failed: ", std::strerror(errno));
  void* data = guard - data_bytes;  // the data's end touches the guard page
  Header* header =
      stamp(static_cast<char*>(data) - kHeaderBytes, mapped, BlockKind::kGuarded, nullptr);
  header->mapping = mapping;
  return {data, data, &GuardedCpuAllocator::free_block, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr GuardedCpuAllocator::raw_deleter() const {
  return &GuardedCpuAllocator::free_block;
}

#if TORCH_VERSION_MAJOR >= 2
void GuardedCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}
#endif

void GuardedCpuAllocator::free_block(void* data) {
  if (data == nullptr) return;
  Header* header = checked_header(data);
  if (header->kind != BlockKind::kGuarded) corrupted_header(data);
  // Unmapped, not kept: a later read or write through a stale pointer faults too.
  ::munmap(header->mapping, header->bytes);
}

// ---- Installing -------------------------------------------------------------------------------

namespace {

std::atomic<CachingCpuAllocator*> installed_caching{nullptr};

// Under the guarded allocator a fault is the finding: it gets the one error line every failure
// of dptrain gets, with the address, instead of a bare "Segmentation fault" and a core dump.
// (Under gdb the debugger sees the SIGSEGV first, so the faulting instruction stays findable.)
// Only async-signal-safe calls: the address is formatted by hand and written with write(2).
void report_guard_fault(int, siginfo_t* info, void*) {
  char line[256];
  size_t length = 0;
  const auto append = [&](const char* text) {
    while (*text && length < sizeof line - 1) line[length++] = *text++;
  };
  append("error: segmentation fault at address 0x");
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int shift = 60; shift >= 0; shift -= 4) {
    line[length++] = "0123456789abcdef"[(address >> shift) & 0xf];
  }
  append(
      " under --cpu-allocator guarded: a read or write outside a tensor, or into a freed "
      "one (run under gdb to see where)\n");
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line, length);
  ::_exit(70);
}

void report_faults_in_one_line() {
  struct sigaction action = {};
  action.sa_sigaction = &report_guard_fault;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGSEGV, &action, nullptr);
}

}  // namespace

void install_cpu_allocator(CpuAllocatorKind kind) {
  if (kind == CpuAllocatorKind::kSystem) return;
  // Never destroyed: tensors freed during exit still call into it.
  c10::Allocator* allocator = nullptr;
  if (kind == CpuAllocatorKind::kCaching) {
    static auto* caching = new CachingCpuAllocator;
    allocator = caching;
    installed_caching = caching;
  } else {
    static auto* guarded = new GuardedCpuAllocator;
    allocator = guarded;
    report_faults_in_one_line();
  }
  // The highest priority, so that no registration LibTorch makes later displaces it.
  c10::SetAllocator(c10::DeviceType::CPU, allocator, UINT8_MAX);
  if (c10::GetAllocator(c10::DeviceType::CPU) != allocator) {
    throw std::runtime_error("LibTorch kept its own CPU allocator; the " +
                             cpu_allocator_name(kind) + " one was not installed");
  }
}

CpuAllocatorStats installed_cpu_allocator_stats() {
  const CachingCpuAllocator* caching = installed_caching;
  return caching ? caching->stats() : CpuAllocatorStats{};
}

}  // namespace dptrain
