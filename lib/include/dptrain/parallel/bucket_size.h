// The default size of the reducer's gradient buckets, as plain data: the options that carry the
// size (train/options.h) take it from here without the reducer's tensors and hooks.
// Not here: how the buckets are filled and reduced (reducer.h).
#pragma once

#include <cstdint>

namespace dptrain {

constexpr int64_t kDefaultBucketBytes = 25 * 1024 * 1024;  // DDP's default bucket_cap_mb

}  // namespace dptrain
