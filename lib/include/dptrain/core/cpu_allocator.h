// The CPU allocator dptrain installs in LibTorch: large blocks a training step frees are kept for
// the next step instead of going back to the system. Not here: GPU memory (CUDA's caching
// allocator already does this), or how much memory a run needs (memory_budget.h).
#pragma once

#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

namespace dptrain {

// LibTorch 2.x made allocate() non-const and added copy_data().
#if TORCH_VERSION_MAJOR >= 2
#define DPTRAIN_ALLOCATE_CONST
#else
#define DPTRAIN_ALLOCATE_CONST const
#endif

struct CpuBlockHeader;  // in front of every block: cpu_allocator.cpp

enum class CpuAllocatorKind {
  kCaching,  // CachingCpuAllocator: the default
  kSystem,   // LibTorch's own (posix_memalign and free per tensor)
  kGuarded,  // GuardedCpuAllocator: a check for out-of-bounds writes, slow
};

// "caching", "system", "guarded"
std::string cpu_allocator_name(CpuAllocatorKind kind);
// The inverse, for --cpu-allocator; throws UsageError naming the flag and the accepted names.
CpuAllocatorKind parse_cpu_allocator(const std::string& name);

struct CpuAllocatorStats {
  int64_t live_bytes = 0;       // in tensors now (blocks of the cached sizes only)
  int64_t peak_live_bytes = 0;  // the most live_bytes has been
  int64_t cached_bytes = 0;     // freed by tensors, kept for reuse
  int64_t hits = 0;             // allocations served from the cache
  int64_t misses = 0;           // allocations that asked the system
  int64_t evictions = 0;        // cached blocks given back to keep the footprint at the peak
};

// Note [Why dptrain caches CPU blocks]
// LibTorch asks glibc for every tensor and frees it when its last reference goes. A step at
// width 16 and batch 256 allocates activations of up to 13 MB; glibc serves blocks that size
// with mmap and gives them back with munmap, so every step faults its activations in again,
// page by page: 470,000 minor faults in 18 steps, and 0.9 s of a 6 s run in the kernel. This
// allocator keeps such blocks, by size, and hands them back when the same size is asked for
// again -- which, as every step repeats the shapes of the one before, is nearly always: at that
// width, 75 misses in 36 steps, all in the first, against 9,899 hits.
//
// Memory stays bounded: the footprint of the cached sizes (live + cached) never passes
// kFootprintPeaks times the most that was ever live at once. A miss that would pass it first
// gives the oldest cached blocks back to the system. A bound of 1 (only the peak working set)
// thrashed: a step needs 1.32 peaks of blocks, as blocks of one size are busiest at other
// moments than blocks of another, and evicting to fit in less cost more than it saved. A
// request the system cannot meet gives the whole cache back and is tried once more. Small
// blocks (under kCachedFrom) go to LibTorch's allocator untouched: glibc keeps those in its
// own free lists without system calls.
//
// Every block starts with a 64-byte header (the owner, the size, two check words), so one deleter
// serves all of them, as c10::Allocator::raw_deleter requires, and a header overwritten by a
// neighbour's out-of-bounds write is reported instead of corrupting the cache.
class CachingCpuAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kCachedFrom = 64 * 1024;  // smaller requests: LibTorch's allocator
  static constexpr size_t kRounding = 4096;         // cached sizes are whole pages
  static constexpr int64_t kFootprintPeaks = 2;     // live + cached <= this many peak lives

  c10::DataPtr allocate(size_t bytes) DPTRAIN_ALLOCATE_CONST override;
  c10::DeleterFnPtr raw_deleter() const override;
#if TORCH_VERSION_MAJOR >= 2
  void copy_data(void* dest, const void* src, std::size_t count) const override;
#endif

  CpuAllocatorStats stats() const;
  // Gives every cached block back to the system (tensors still alive are untouched).
  void release_cached();

 private:
  static void free_block(void* data);
  void* allocate_block(size_t bytes);
  void recycle(CpuBlockHeader* header);
  void evict_oldest();  // the caller holds mutex_

  mutable std::mutex mutex_;
  // Free blocks, oldest first, and per size the same blocks in the same order.
  std::list<CpuBlockHeader*> free_by_age_;
  std::unordered_map<size_t, std::deque<std::list<CpuBlockHeader*>::iterator>> free_by_size_;
  CpuAllocatorStats stats_;
};

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

// The caching allocator's figures, once install_cpu_allocator(kCaching) ran; zeros otherwise.
CpuAllocatorStats installed_cpu_allocator_stats();

}  // namespace dptrain
