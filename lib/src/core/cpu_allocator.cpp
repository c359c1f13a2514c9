// The guarded CPU allocator (checks) and the names of --cpu-allocator. See cpu_allocator.h.
#include "dptrain/core/cpu_allocator.h"

#include <c10/util/Exception.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "dptrain/core/errors.h"

namespace dptrain {

namespace {

constexpr size_t kHeaderBytes = 64;  // keeps the data at LibTorch's 64-byte alignment
constexpr uint64_t kCheckWord = 0x6470747261696e21ULL;  // "dptrain!"

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

// In front of every guarded block's data. The check words mix in the header's own address, so a
// header that was overwritten (by a write running under its tensor's start, which the guard page
// after the data cannot catch) or a pointer that never came from here fails the check on free.
struct alignas(kHeaderBytes) CpuBlockHeader {
  uint64_t front_check = 0;
  size_t bytes = 0;         // the mapping's length, header and guard page included
  void* mapping = nullptr;  // the start of the block's mapping
  char padding[32] = {};
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
               "error: the guarded CPU allocator found the header of block %p overwritten: "
               "something wrote before a tensor's start\n",
               data);
  std::fflush(stderr);
  ::_exit(70);
}

Header* checked_header(void* data) {
  Header* header = Header::of(data);
  if (!header->intact()) corrupted_header(data);
  return header;
}

Header* stamp(void* block, size_t bytes, void* mapping) {
  auto* header = new (block) Header;
  header->bytes = bytes;
  header->mapping = mapping;
  header->front_check = header->back_check = header->expected_check();
  return header;
}

}  // namespace

std::string cpu_allocator_name(CpuAllocatorKind kind) {
  switch (kind) {
    case CpuAllocatorKind::kSystem:
      return "system";
    case CpuAllocatorKind::kGuarded:
      return "guarded";
  }
  return "system";
}

CpuAllocatorKind parse_cpu_allocator(const std::string& name) {
  for (const auto kind : {CpuAllocatorKind::kSystem, CpuAllocatorKind::kGuarded}) {
    if (name == cpu_allocator_name(kind)) return kind;
  }
  // Note [CPU memory: tcmalloc, not a cache of our own] in cpu_allocator.h.
  const std::string gone = name == "caching" ? " (the caching allocator is gone: tcmalloc, linked "
                                               "into dptrain, does its job)"
                                             : "";
  throw UsageError("--cpu-allocator: '" + name + "' is not an allocator" + gone +
                   "; expected system or guarded");
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
  stamp(static_cast<char*>(data) - kHeaderBytes, mapped, mapping);
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
  // Unmapped, not kept: a later read or write through a stale pointer faults too.
  ::munmap(header->mapping, header->bytes);
}

// ---- Installing -------------------------------------------------------------------------------

namespace {

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
  static auto* guarded = new GuardedCpuAllocator;
  c10::Allocator* allocator = guarded;
  report_faults_in_one_line();
  // The highest priority, so that no registration LibTorch makes later displaces it.
  c10::SetAllocator(c10::DeviceType::CPU, allocator, UINT8_MAX);
  if (c10::GetAllocator(c10::DeviceType::CPU) != allocator) {
    throw std::runtime_error("LibTorch kept its own CPU allocator; the " +
                             cpu_allocator_name(kind) + " one was not installed");
  }
}

}  // namespace dptrain
