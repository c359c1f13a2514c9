// The CPU allocator a run may install in LibTorch instead of its own: guarded, a check that stops
// at out-of-bounds writes. Not here: which malloc serves LibTorch's own allocator (tcmalloc,
// linked into the dptrain binary: app/CMakeLists.txt), GPU memory, or how much memory a run
// needs (memory_budget.h).
#pragma once

#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <cstddef>
#include <string>

namespace dptrain {

// LibTorch 2.x made allocate() non-const and added copy_data().
#if TORCH_VERSION_MAJOR >= 2
#define DPTRAIN_ALLOCATE_CONST
#else
#define DPTRAIN_ALLOCATE_CONST const
#endif

struct CpuBlockHeader;  // in front of every guarded block: cpu_allocator.cpp

enum class CpuAllocatorKind {
  kSystem,   // LibTorch's own (posix_memalign and free per tensor, tcmalloc's in dptrain): default
  kGuarded,  // GuardedCpuAllocator: a check for out-of-bounds writes, slow
};

// "system", "guarded"
std::string cpu_allocator_name(CpuAllocatorKind kind);
// The inverse, for --cpu-allocator; throws UsageError naming the flag and the accepted names.
CpuAllocatorKind parse_cpu_allocator(const std::string& name);

// Note [CPU memory: tcmalloc, not a cache of our own]
// LibTorch asks malloc for every tensor and frees it when its last reference goes, and a step
// repeats the shapes of the one before. glibc's malloc hands some of those blocks back to the
// kernel and faults them in again, page by page, in the next step: with two replicas at width
// 16, 1,500 to 23,000 minor faults a step, and 8,500 to 14,000 with its tunables
// (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD) at their largest. Set beside a caching allocator of our
// own, glibc, glibc tuned, jemalloc with and without PyTorch's tuning-guide MALLOC_CONF and
// mimalloc on the same steps, with one replica and two, tcmalloc-minimal matches the cache --
// under 800 faults and no more system time a step, images/s within the noise -- at 0.8x its
// peak resident set, where jemalloc and mimalloc fault 60,000 to 120,000 pages a step
// (bench/results/2026-12-04-cpu-allocators.md). So dptrain keeps no cache of its own: the
// binary links tcmalloc-minimal (Debian's libtcmalloc-minimal4, app/CMakeLists.txt), which then
// serves LibTorch's allocations too, with nothing to set at run time. Sanitizer builds keep
// glibc's malloc, which the sanitizer replaces anyway.

// Every block is mapped on its own, its last byte against an inaccessible page, and unmapped
// when freed: a write past the end of a tensor, or into a freed one, stops the process with
// SIGSEGV at the faulting instruction. That also holds for the machine code oneDNN generates
// at run time, which valgrind and AddressSanitizer do not see (and valgrind cannot run its
// AVX-512 kernels at all). Sizes are rounded up to 64 bytes for alignment, so a write less than
// 64 bytes past a size that is not a multiple of 64 can go unnoticed. For checks, not speed:
// one mmap and munmap per tensor.
class GuardedCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) DPTRAIN_ALLOCATE_CONST override;
  c10::DeleterFnPtr raw_deleter() const override;
#if TORCH_VERSION_MAJOR >= 2
  void copy_data(void* dest, const void* src, std::size_t count) const override;
#endif

 private:
  static void free_block(void* data);
};

// Makes `kind` LibTorch's CPU allocator for the rest of the process (tensors that exist already
// keep their own deleters). Call it once, early, before threads allocate: LibTorch's
// SetAllocator is not thread-safe. kSystem leaves LibTorch's allocator in place.
void install_cpu_allocator(CpuAllocatorKind kind);

}  // namespace dptrain
