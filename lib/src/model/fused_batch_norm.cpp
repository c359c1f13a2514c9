// BatchNorm + shortcut + ReLU in one pass over memory each way, on the CPU. See
// fused_batch_norm.h.
#include "dptrain/model/fused_batch_norm.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace dptrain {

// Note [Fusing BatchNorm, the shortcut and the ReLU]
// Between two convolutions the book's block runs BatchNorm, the shortcut's sum and a ReLU, each
// a separate pass over an activation-sized tensor in LibTorch: the statistics read x, the
// normalisation reads x and writes a tensor, the sum and the ReLU each read and write it again.
// Together they cost about a third as much as the convolutions at width 16
// (bench/results/2026-12-01-cpu-profiles.md); torch.compile fuses them, and so does this file.
// Here the forward reads x once for the statistics and once
// more, with the shortcut, to write the output; the backward reads the incoming gradient, the
// output (whose sign is the ReLU's mask) and x once for the two per-channel sums and once to
// write the gradients, and no masked gradient is ever materialised apart from the shortcut's.
//
// Numerics: per-channel sums in float64 whatever the input type, and every value centred before
// it is scaled: the output is (x - mean) * (gamma * inverse_std) + beta, never x * scale +
// (beta - mean * scale), whose two terms cancel to within float32 rounding of their own size
// when the mean is large against the spread. The mean is carried as two floats (its value and
// the rest), so x - mean loses nothing beyond x's own rounding. The variance comes from one pass
// of sums of (x - k) and (x - k)^2 with k a value of the channel itself, which removes the
// cancellation E[x^2] - mean^2 suffers when the mean is large against the spread. The
// backward's sum of grad * (x - mean) is centred the same way, never
// sum(grad * x) - mean * sum(grad).
//
// Work is split into a fixed number of parts per call, each part's sums are kept apart and
// added in part order, so the bits do not depend on which thread ran what: replicas with the
// same thread count stay bit-identical.
//
// Note [The fused path in bf16]
// Under bf16 autocast the convolutions return bf16. Left to LibTorch, bf16 would run its own
// BatchNorm, then the sum and the ReLU apart, three passes each way, and LibTorch 1.13's bf16
// BatchNorm is slow in channels-last at few channels (at width 8 slower than the whole float32
// path). Here bf16 x, shortcut and gradients are taken as they are: each value is
// widened to float32 (exactly: bf16 is float32's upper half), everything is computed as the float32
// path computes it (the statistics and the parameters' gradients in float64 sums, the parameters
// and running statistics in float32), and a result is rounded to bf16 once, when it is stored, to
// nearest with ties to even as c10::BFloat16 rounds. So a bf16 result is the float32 path's result
// on the same inputs rounded once, to the bit (FusedBatchNorm.Bf16IsTheFloat32PathRoundedOnce), and
// the activations stay bf16 from one convolution to the next, residual sums included.
// It is faster than LibTorch's bf16 BatchNorm, sum and ReLU at the book's channels-last shapes,
// most of all at width 8, and so is the whole bf16 step; the bf16 loops move half the bytes of
// float32's yet take longer, as the widening and the rounding cost more than the bytes save
// (bench/results/2026-12-05-cpu-bf16-fused-path.md, bench/cpp/fused_batch_norm_bench, with the
// loop shapes measured and not taken).
//
// Note [The convolution's bias gradient]
// Each convolution of the book's model that feeds a BatchNorm has a bias, and the gradient of
// that bias is the sum of the convolution output's gradient over N, H and W. oneDNN forms it in a
// loop of its own, one more pass over that gradient (in Debian's oneDNN 2.6 in 128-bit vectors):
// at width 16 on an AVX2 EPYC some 6% of the step's CPU time
// (bench/results/2026-12-07-cpu-fused-bias-grad.md). The BatchNorm's backward writes that
// gradient here anyway, value by value; with a conv_bias the same loop adds each stored value into
// float64 sums per channel and part (added in part order, as the statistics are), and the
// convolution, which took its bias detached, skips its own sum. Its output, its input's gradient
// and its weight's are the same bits either way (oneDNN computes them apart from the bias); only
// the bias's gradient changes. Its exact value is zero, as BatchNorm in training takes each
// channel's mean out and a constant added before it changes nothing, so float32 leaves rounding
// either way, some 1e-6 of the largest gradient. Opt-in (--conv-bias-grad fused): the book's run
// keeps oneDNN's bits.
namespace {

// ---- Layout -------------------------------------------------------------------------------

// How a (N, C, H, W) tensor lies in memory: `outer` blocks of C channels, each channel a run of
// `inner` consecutive values, channel after channel at distance `inner` (contiguous: N blocks,
// inner H * W) or interleaved (channels-last: N * H * W blocks of one value per channel).
struct Layout {
  bool channels_last = false;
  int64_t outer = 0;     // N, or N * H * W
  int64_t channels = 0;  // C
  int64_t inner = 0;     // H * W, or 1
  int64_t per_channel() const { return outer * inner; }
};

// Channels-last only where contiguous does not describe the memory: with C or H * W equal to 1
// the two layouts are the same bytes, and contiguous is then the one every tensor agrees on.
Layout layout_of(const torch::Tensor& x) {
  Layout layout;
  layout.channels = x.size(1);
  layout.channels_last = !x.is_contiguous();
  const int64_t pixels = x.size(2) * x.size(3);
  layout.outer = layout.channels_last ? x.size(0) * pixels : x.size(0);
  layout.inner = layout.channels_last ? 1 : pixels;
  return layout;
}

at::MemoryFormat memory_format_of(const Layout& layout) {
  return layout.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

// ---- Parallel parts -----------------------------------------------------------------------

// Splits [0, total) into as many parts as LibTorch has threads (fewer when the work is small),
// runs body(part, begin, end) on them in parallel, and returns the number of parts.
template <typename Body>
int64_t for_each_part(int64_t total, int64_t min_per_part, const Body& body) {
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(at::get_num_threads(), total / std::max<int64_t>(1, min_per_part)));
  at::parallel_for(0, parts, /*grain_size=*/1, [&](int64_t first, int64_t last) {
    for (int64_t part = first; part < last; ++part) {
      body(part, total * part / parts, total * (part + 1) / parts);
    }
  });
  return parts;
}

// One part's running sums, in memory of the thread's own: parts that updated neighbouring slots
// of one array row by row would share cache lines, and two threads then ran slower than one.
struct PartSums {
  explicit PartSums(int64_t channels) : first(channels, 0.0), second(channels, 0.0) {}
  std::vector<double> first, second;
};

// Per-channel sums of two quantities, kept per part and added in part order.
struct ChannelSums {
  ChannelSums(int64_t parts, int64_t channels)
      : channels(channels), first(parts * channels, 0.0), second(parts * channels, 0.0) {}
  void store(int64_t part, const PartSums& sums) {
    std::copy(sums.first.begin(), sums.first.end(), first.begin() + part * channels);
    std::copy(sums.second.begin(), sums.second.end(), second.begin() + part * channels);
  }
  // Folds parts 1.. into part 0, in order.
  void reduce(int64_t parts) {
    for (int64_t p = 1; p < parts; ++p) {
      for (int64_t c = 0; c < channels; ++c) {
        first[c] += first[p * channels + c];
        second[c] += second[p * channels + c];
      }
    }
  }
  int64_t channels;
  std::vector<double> first, second;
};

// Minimum values per part: below this the threads cost more than they save.
constexpr int64_t kValuesPerPart = 16384;

// A float64 mean as the sum of two values of T: x - hi is exact for x near the mean (Sterbenz),
// and subtracting lo then leaves one rounding.
template <typename T>
struct SplitMean {
  explicit SplitMean(const double* mean, int64_t channels) : hi(channels), lo(channels) {
    for (int64_t c = 0; c < channels; ++c) {
      hi[c] = static_cast<T>(mean[c]);
      lo[c] = static_cast<T>(mean[c] - static_cast<double>(hi[c]));
    }
  }
  std::vector<T> hi, lo;
};

// Eight running sums per channel run, so the compiler can keep them in vector registers
// without reordering a single sum (it may not reorder floating-point additions itself).
constexpr int64_t kLanes = 8;

// ---- Loops --------------------------------------------------------------------------------
// Each loop over one part of the data, as a template for float and double. The float versions
// are compiled for AVX-512, AVX2 and the baseline alike and the best the CPU runs is chosen when
// the program loads (target_clones): LibTorch's own kernels dispatch the same way, and in SSE2
// alone these loops would be slower than LibTorch's. The file builds with -ffp-contract=off, so
// no version fuses a multiply and an add: every version gives the same bits. AddressSanitizer
// builds keep the baseline alone (an ifunc resolver runs while the program is relocated, before
// the sanitiser's runtime is up); valgrind, which runs the AVX2 version, checks those.

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__SANITIZE_ADDRESS__)
#define DPTRAIN_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DPTRAIN_ISA_CLONES
#endif

// ---- Storage and arithmetic ------------------------------------------------------------------
// A loop reads and writes values of its storage type S and computes in Arithmetic<S>: float and
// double in themselves, bf16 in float, widened on load and rounded once on store (Note [The
// fused path in bf16]).
template <typename S>
struct ArithmeticOf {
  using type = S;
};
template <>
struct ArithmeticOf<c10::BFloat16> {
  using type = float;
};
template <typename S>
using Arithmetic = typename ArithmeticOf<S>::type;

inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(c10::BFloat16 v) {  // exact: bf16 is float's upper half
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename S>
inline S narrow(Arithmetic<S> v) {
  return v;
}
// Round to nearest, ties to even, NaN to the quiet NaN 0x7FC0: the bits c10::BFloat16's own
// conversion gives, written without its branch so that the loops vectorise.
template <>
inline c10::BFloat16 narrow<c10::BFloat16>(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return c10::BFloat16(static_cast<uint16_t>(nan ? 0x7FC0u : rounded), c10::BFloat16::from_bits());
}

// The gradient through the ReLU: grad where its output is positive, else 0. Both values come in
// as arguments, loaded whatever the sign, which is what lets the compiler vectorise the loops
// (a load under a condition it will not turn into a select).
template <typename T>
inline T through_relu(T grad, T out) {
  return out > T(0) ? grad : T(0);
}

template <typename T>
inline T relu(T v) {  // keeps a NaN, as LibTorch's relu does
  return v < T(0) ? T(0) : v;
}

// Channels-last: rows [begin, end) of C values. s1 += x - shift, s2 += (x - shift)^2.
template <typename S>
inline void shifted_sums_rows(const S* __restrict x, int64_t begin, int64_t end, int64_t C,
                              const double* __restrict shift, double* __restrict s1,
                              double* __restrict s2) {
  for (int64_t row = begin; row < end; ++row) {
    const S* __restrict values = x + row * C;
    for (int64_t c = 0; c < C; ++c) {
      const double d = static_cast<double>(widen(values[c])) - shift[c];
      s1[c] += d;
      s2[c] += d * d;
    }
  }
}

// Contiguous: one run of n values of a channel, into kLanes running sums and a tail.
template <typename S>
inline void shifted_sums_run(const S* __restrict values, int64_t n, double shift,
                             double* __restrict lane1, double* __restrict lane2,
                             double* __restrict tail) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const double d = static_cast<double>(widen(values[i + j])) - shift;
      lane1[j] += d;
      lane2[j] += d * d;
    }
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(widen(values[i])) - shift;
    tail[0] += d;
    tail[1] += d * d;
  }
}

// out = relu((x - hi - lo) * a + b (+ s)), element by element; the per-element coefficients
// come from per-channel arrays (channels-last, `per_channel` true) or are one value each.
template <typename S, typename T = Arithmetic<S>>
inline void normalise_rows(const S* __restrict x, const S* __restrict s, int64_t begin, int64_t end,
                           int64_t C, const T* __restrict hi, const T* __restrict lo,
                           const T* __restrict a, const T* __restrict b, S* __restrict out) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t at = row * C;
    if (s != nullptr) {
      for (int64_t c = 0; c < C; ++c) {
        out[at + c] =
            narrow<S>(relu((widen(x[at + c]) - hi[c] - lo[c]) * a[c] + b[c] + widen(s[at + c])));
      }
    } else {
      for (int64_t c = 0; c < C; ++c) {
        out[at + c] = narrow<S>(relu((widen(x[at + c]) - hi[c] - lo[c]) * a[c] + b[c]));
      }
    }
  }
}

template <typename S, typename T = Arithmetic<S>>
inline void normalise_run(const S* __restrict x, const S* __restrict s, int64_t n, T hi, T lo, T a,
                          T b, S* __restrict out) {
  if (s != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      out[i] = narrow<S>(relu((widen(x[i]) - hi - lo) * a + b + widen(s[i])));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = narrow<S>(relu((widen(x[i]) - hi - lo) * a + b));
  }
}

// Channels-last: s1 += g, s2 += g * (x - mean), g the gradient through the ReLU.
template <typename S, typename T = Arithmetic<S>>
inline void gradient_sums_rows(const S* __restrict grad, const S* __restrict out,
                               const S* __restrict x, int64_t begin, int64_t end, int64_t C,
                               const T* __restrict hi, const T* __restrict lo,
                               double* __restrict s1, double* __restrict s2) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t at = row * C;
    for (int64_t c = 0; c < C; ++c) {
      const T g = through_relu(widen(grad[at + c]), widen(out[at + c]));
      s1[c] += static_cast<double>(g);
      s2[c] += static_cast<double>(g * (widen(x[at + c]) - hi[c] - lo[c]));
    }
  }
}

template <typename S, typename T = Arithmetic<S>>
inline void gradient_sums_run(const S* __restrict grad, const S* __restrict out,
                              const S* __restrict x, int64_t n, T hi, T lo,
                              double* __restrict lane1, double* __restrict lane2,
                              double* __restrict tail) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const T g = through_relu(widen(grad[i + j]), widen(out[i + j]));
      lane1[j] += static_cast<double>(g);
      lane2[j] += static_cast<double>(g * (widen(x[i + j]) - hi - lo));
    }
  }
  for (; i < n; ++i) {
    const T g = through_relu(widen(grad[i]), widen(out[i]));
    tail[0] += static_cast<double>(g);
    tail[1] += static_cast<double>(g * (widen(x[i]) - hi - lo));
  }
}

// dx = g * a + (x - mean) * b + d, and ds = g where ds is not null; where dx_sums is not null,
// dx_sums += dx per channel, of the values as stored.
template <typename S, typename T = Arithmetic<S>>
inline void input_gradients_rows(const S* __restrict grad, const S* __restrict out,
                                 const S* __restrict x, int64_t begin, int64_t end, int64_t C,
                                 const T* __restrict hi, const T* __restrict lo,
                                 const T* __restrict a, const T* __restrict b,
                                 const T* __restrict d, S* __restrict dx, S* __restrict ds,
                                 double* __restrict dx_sums) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t at = row * C;
    if (dx_sums != nullptr) {
      for (int64_t c = 0; c < C; ++c) {
        const T g = through_relu(widen(grad[at + c]), widen(out[at + c]));
        const S v = narrow<S>(g * a[c] + (widen(x[at + c]) - hi[c] - lo[c]) * b[c] + d[c]);
        dx[at + c] = v;
        dx_sums[c] += static_cast<double>(widen(v));
      }
    } else {
      for (int64_t c = 0; c < C; ++c) {
        const T g = through_relu(widen(grad[at + c]), widen(out[at + c]));
        dx[at + c] = narrow<S>(g * a[c] + (widen(x[at + c]) - hi[c] - lo[c]) * b[c] + d[c]);
      }
    }
    if (ds != nullptr) {
      for (int64_t c = 0; c < C; ++c) {
        ds[at + c] = narrow<S>(through_relu(widen(grad[at + c]), widen(out[at + c])));
      }
    }
  }
}

// Contiguous: as above for one run; with lanes not null, the stored dx also into kLanes running
// sums and tail[0].
template <typename S, typename T = Arithmetic<S>>
inline void input_gradients_run(const S* __restrict grad, const S* __restrict out,
                                const S* __restrict x, int64_t n, T hi, T lo, T a, T b, T d,
                                S* __restrict dx, S* __restrict ds, double* __restrict lanes,
                                double* __restrict tail) {
  // By value: a lambda that took the pointers by reference could cost them __restrict.
  const auto gradient = [=](int64_t i) {
    const T g = through_relu(widen(grad[i]), widen(out[i]));
    return narrow<S>(g * a + (widen(x[i]) - hi - lo) * b + d);
  };
  if (lanes != nullptr) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) {
        const S v = gradient(i + j);
        dx[i + j] = v;
        lanes[j] += static_cast<double>(widen(v));
      }
    }
    for (; i < n; ++i) {
      const S v = gradient(i);
      dx[i] = v;
      tail[0] += static_cast<double>(widen(v));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) dx[i] = gradient(i);
  }
  if (ds != nullptr) {
    for (int64_t i = 0; i < n; ++i) ds[i] = narrow<S>(through_relu(widen(grad[i]), widen(out[i])));
  }
}

// The float and bf16 entry points, one per ISA (a call with floats or bf16 values takes these
// over the templates above); double, used by the tests' references, calls the templates as
// compiled.
#define DPTRAIN_LOOP_ENTRY_POINTS(S)                                                              \
  DPTRAIN_ISA_CLONES void shifted_sums_rows(const S* x, int64_t begin, int64_t end, int64_t C,    \
                                            const double* shift, double* s1, double* s2) {        \
    shifted_sums_rows<S>(x, begin, end, C, shift, s1, s2);                                        \
  }                                                                                               \
  DPTRAIN_ISA_CLONES void shifted_sums_run(const S* values, int64_t n, double shift,              \
                                           double* lane1, double* lane2, double* tail) {          \
    shifted_sums_run<S>(values, n, shift, lane1, lane2, tail);                                    \
  }                                                                                               \
  DPTRAIN_ISA_CLONES void normalise_rows(const S* x, const S* s, int64_t begin, int64_t end,      \
                                         int64_t C, const float* hi, const float* lo,             \
                                         const float* a, const float* b, S* out) {                \
    normalise_rows<S>(x, s, begin, end, C, hi, lo, a, b, out);                                    \
  }                                                                                               \
  DPTRAIN_ISA_CLONES void normalise_run(const S* x, const S* s, int64_t n, float hi, float lo,    \
                                        float a, float b, S* out) {                               \
    normalise_run<S>(x, s, n, hi, lo, a, b, out);                                                 \
  }                                                                                               \
  DPTRAIN_ISA_CLONES void gradient_sums_rows(                                                     \
      const S* grad, const S* out, const S* x, int64_t begin, int64_t end, int64_t C,             \
      const float* hi, const float* lo, double* s1, double* s2) {                                 \
    gradient_sums_rows<S>(grad, out, x, begin, end, C, hi, lo, s1, s2);                           \
  }                                                                                               \
  DPTRAIN_ISA_CLONES void gradient_sums_run(const S* grad, const S* out, const S* x, int64_t n,   \
                                            float hi, float lo, double* lane1, double* lane2,     \
                                            double* tail) {                                       \
    gradient_sums_run<S>(grad, out, x, n, hi, lo, lane1, lane2, tail);                            \
  }                                                                                               \
  DPTRAIN_ISA_CLONES void input_gradients_rows(                                                   \
      const S* grad, const S* out, const S* x, int64_t begin, int64_t end, int64_t C,             \
      const float* hi, const float* lo, const float* a, const float* b, const float* d, S* dx,    \
      S* ds, double* dx_sums) {                                                                   \
    input_gradients_rows<S>(grad, out, x, begin, end, C, hi, lo, a, b, d, dx, ds, dx_sums);       \
  }                                                                                               \
  DPTRAIN_ISA_CLONES void input_gradients_run(const S* grad, const S* out, const S* x, int64_t n, \
                                              float hi, float lo, float a, float b, float d,      \
                                              S* dx, S* ds, double* lanes, double* tail) {        \
    input_gradients_run<S>(grad, out, x, n, hi, lo, a, b, d, dx, ds, lanes, tail);                \
  }

DPTRAIN_LOOP_ENTRY_POINTS(float)
DPTRAIN_LOOP_ENTRY_POINTS(c10::BFloat16)
#undef DPTRAIN_LOOP_ENTRY_POINTS

// ---- Statistics ---------------------------------------------------------------------------

// Two sums per channel over all of x's values, in either layout: rows(begin, end, s1, s2) adds
// rows [begin, end) of a channels-last tensor into s1 and s2 (C each); run(offset, c, lane1,
// lane2, tail) adds one contiguous run of channel c starting at element `offset`.
template <typename Rows, typename Run>
ChannelSums channel_sums(const Layout& layout, const Rows& rows, const Run& run) {
  const int64_t C = layout.channels;
  if (layout.channels_last) {
    ChannelSums sums(at::get_num_threads(), C);
    const int64_t parts = for_each_part(layout.outer, std::max<int64_t>(1, kValuesPerPart / C),
                                        [&](int64_t part, int64_t begin, int64_t end) {
                                          PartSums local(C);
                                          rows(begin, end, local.first.data(), local.second.data());
                                          sums.store(part, local);
                                        });
    sums.reduce(parts);
    return sums;
  }
  ChannelSums sums(1, C);
  at::parallel_for(0, C, /*grain_size=*/1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      double lane1[kLanes] = {}, lane2[kLanes] = {}, tail[2] = {};
      for (int64_t n = 0; n < layout.outer; ++n) {
        run((n * C + c) * layout.inner, c, lane1, lane2, tail);
      }
      for (int64_t j = 0; j < kLanes; ++j) {
        tail[0] += lane1[j];
        tail[1] += lane2[j];
      }
      sums.first[c] = tail[0];
      sums.second[c] = tail[1];
    }
  });
  return sums;
}

// Sums of (x - shift) and (x - shift)^2 per channel.
template <typename T>
ChannelSums shifted_sums(const T* x, const Layout& layout, const double* shift) {
  return channel_sums(
      layout,
      [&](int64_t begin, int64_t end, double* s1, double* s2) {
        shifted_sums_rows(x, begin, end, layout.channels, shift, s1, s2);
      },
      [&](int64_t at, int64_t c, double* lane1, double* lane2, double* tail) {
        shifted_sums_run(x + at, layout.inner, shift[c], lane1, lane2, tail);
      });
}

// ---- Forward ------------------------------------------------------------------------------

// One element-wise pass over x's values, in parallel, in either layout: rows(begin, end) takes
// rows [begin, end) of a channels-last tensor; run(offset, c) one contiguous run of channel c.
template <typename Rows, typename Run>
void for_each_value(const Layout& layout, const Rows& rows, const Run& run) {
  if (layout.channels_last) {
    for_each_part(layout.outer, std::max<int64_t>(1, kValuesPerPart / layout.channels),
                  [&](int64_t, int64_t begin, int64_t end) { rows(begin, end); });
    return;
  }
  for_each_part(layout.outer * layout.channels, std::max<int64_t>(1, kValuesPerPart / layout.inner),
                [&](int64_t, int64_t begin, int64_t end) {
                  for (int64_t r = begin; r < end; ++r) run(r * layout.inner, r % layout.channels);
                });
}

// out = relu((x - mean) * scale + beta (+ shortcut)) per channel.
template <typename S, typename T = Arithmetic<S>>
void normalise_add_relu(const S* x, const S* shortcut, const Layout& layout,
                        const SplitMean<T>& mean, const std::vector<T>& scale,
                        const std::vector<T>& beta, S* out) {
  for_each_value(
      layout,
      [&](int64_t begin, int64_t end) {
        normalise_rows(x, shortcut, begin, end, layout.channels, mean.hi.data(), mean.lo.data(),
                       scale.data(), beta.data(), out);
      },
      [&](int64_t at, int64_t c) {
        normalise_run(x + at, shortcut != nullptr ? shortcut + at : nullptr, layout.inner,
                      mean.hi[c], mean.lo[c], scale[c], beta[c], out + at);
      });
}

// ---- Backward -----------------------------------------------------------------------------

// Per channel: sum of g and of g * (x - mean), where g is the gradient through the ReLU (zero
// where the output is not positive).
template <typename S, typename T = Arithmetic<S>>
ChannelSums masked_gradient_sums(const S* grad, const S* out, const S* x, const Layout& layout,
                                 const SplitMean<T>& mean) {
  return channel_sums(
      layout,
      [&](int64_t begin, int64_t end, double* s1, double* s2) {
        gradient_sums_rows(grad, out, x, begin, end, layout.channels, mean.hi.data(),
                           mean.lo.data(), s1, s2);
      },
      [&](int64_t at, int64_t c, double* lane1, double* lane2, double* tail) {
        gradient_sums_run(grad + at, out + at, x + at, layout.inner, mean.hi[c], mean.lo[c], lane1,
                          lane2, tail);
      });
}

// dx = g * a + (x - mean) * b + d per channel, with g masked as above; the masked g itself is
// the shortcut's gradient, written when grad_shortcut is not null. With `sum_dx`, also the sum
// of dx per channel, in float64 (ChannelSums::first; Note [The convolution's bias gradient]);
// without it, an empty ChannelSums. dx is the same either way, value by value.
template <typename S, typename T = Arithmetic<S>>
ChannelSums input_gradients(const S* grad, const S* out, const S* x, const Layout& layout,
                            const SplitMean<T>& mean, const std::vector<T>& a,
                            const std::vector<T>& b, const std::vector<T>& d, S* grad_x,
                            S* grad_shortcut, bool sum_dx) {
  const auto shortcut_at = [&](int64_t at) {
    return grad_shortcut != nullptr ? grad_shortcut + at : nullptr;
  };
  if (sum_dx) {
    return channel_sums(
        layout,
        [&](int64_t begin, int64_t end, double* s1, double*) {
          input_gradients_rows(grad, out, x, begin, end, layout.channels, mean.hi.data(),
                               mean.lo.data(), a.data(), b.data(), d.data(), grad_x, grad_shortcut,
                               s1);
        },
        [&](int64_t at, int64_t c, double* lane1, double*, double* tail) {
          input_gradients_run(grad + at, out + at, x + at, layout.inner, mean.hi[c], mean.lo[c],
                              a[c], b[c], d[c], grad_x + at, shortcut_at(at), lane1, tail);
        });
  }
  for_each_value(
      layout,
      [&](int64_t begin, int64_t end) {
        input_gradients_rows(grad, out, x, begin, end, layout.channels, mean.hi.data(),
                             mean.lo.data(), a.data(), b.data(), d.data(), grad_x, grad_shortcut,
                             nullptr);
      },
      [&](int64_t at, int64_t c) {
        input_gradients_run(grad + at, out + at, x + at, layout.inner, mean.hi[c], mean.lo[c], a[c],
                            b[c], d[c], grad_x + at, shortcut_at(at), nullptr, nullptr);
      });
  return ChannelSums(0, 0);
}

// ---- The autograd function -------------------------------------------------------------------

template <typename T>
std::vector<T> as_vector(const torch::Tensor& values) {  // (C) of any type -> C values of T
  const auto t = values.detach().to(torch::kFloat64).contiguous();
  const double* p = t.data_ptr<double>();
  return std::vector<T>(p, p + t.numel());
}

// One batch's statistics, float64.
struct BatchStatistics {
  torch::Tensor mean;         // (C)
  torch::Tensor variance;     // (C), biased
  torch::Tensor inverse_std;  // (C), 1 / sqrt(variance + eps)
};

class BatchNormAddRelu : public torch::autograd::Function<BatchNormAddRelu> {
 public:
  // Without a shortcut, `shortcut` is an empty tensor and has_shortcut false: LibTorch 1.13's
  // Function::apply does not take undefined tensors. So with conv_bias: x already holds it, and
  // only its gradient comes from here.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& shortcut, bool has_shortcut,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& conv_bias, bool has_conv_bias,
                               torch::Tensor running_mean, torch::Tensor running_var,
                               double momentum, double eps) {
    const Layout layout = layout_of(x);
    auto out = torch::empty_like(x, x.options().memory_format(memory_format_of(layout)));
    BatchStatistics stats;
    AT_DISPATCH_FLOATING_TYPES_AND(
        at::ScalarType::BFloat16, x.scalar_type(), "batch_norm_add_relu", [&] {
          stats =
              forward_kernel<scalar_t>(x, has_shortcut ? shortcut.data_ptr<scalar_t>() : nullptr,
                                       weight, bias, layout, eps, out);
        });
    {
      torch::NoGradGuard no_grad;
      const auto count = static_cast<double>(layout.per_channel());
      const auto unbiased = stats.variance * (count / (count - 1));
      running_mean.mul_(1 - momentum).add_(stats.mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_(unbiased.to(running_var.scalar_type()), momentum);
    }
    ctx->save_for_backward({x, out, weight, stats.mean, stats.inverse_std});
    ctx->saved_data["has_shortcut"] = has_shortcut;
    ctx->saved_data["conv_bias_type"] =
        has_conv_bias ? static_cast<int64_t>(conv_bias.scalar_type()) : int64_t{-1};
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& out = saved[1];
    const auto& weight = saved[2];
    const Layout layout = layout_of(x);
    const auto grad = grad_outputs[0].to(x.scalar_type()).contiguous(memory_format_of(layout));
    const bool has_shortcut = ctx->saved_data["has_shortcut"].toBool();
    auto grad_x = torch::empty_like(out);
    auto grad_shortcut = has_shortcut ? torch::empty_like(out) : torch::Tensor();
    const int64_t conv_bias_type = ctx->saved_data["conv_bias_type"].toInt();
    torch::Tensor grad_weight, grad_bias, grad_conv_bias;
    AT_DISPATCH_FLOATING_TYPES_AND(
        at::ScalarType::BFloat16, x.scalar_type(), "batch_norm_add_relu_backward", [&] {
          std::tie(grad_weight, grad_bias, grad_conv_bias) =
              backward_kernel<scalar_t>(grad, out, x, weight, saved[3], saved[4], layout, grad_x,
                                        grad_shortcut, conv_bias_type >= 0);
        });
    return {grad_x,
            grad_shortcut,
            torch::Tensor(),
            grad_weight.to(weight.scalar_type()),
            grad_bias.to(weight.scalar_type()),
            conv_bias_type >= 0 ? grad_conv_bias.to(static_cast<at::ScalarType>(conv_bias_type))
                                : torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }

 private:
  template <typename S, typename T = Arithmetic<S>>
  static BatchStatistics forward_kernel(const torch::Tensor& x, const S* shortcut,
                                        const torch::Tensor& weight, const torch::Tensor& bias,
                                        const Layout& layout, double eps, torch::Tensor& out) {
    const int64_t C = layout.channels;
    const S* input = x.data_ptr<S>();
    // The shift: each channel's first value, so the shifted sums stay near the spread.
    std::vector<double> shift(C);
    for (int64_t c = 0; c < C; ++c) shift[c] = static_cast<double>(widen(input[c * layout.inner]));
    auto sums = shifted_sums(input, layout, shift.data());
    const auto count = static_cast<double>(layout.per_channel());
    const auto gamma = as_vector<double>(weight);
    const auto beta = as_vector<double>(bias);
    BatchStatistics stats{torch::empty({C}, torch::kFloat64), torch::empty({C}, torch::kFloat64),
                          torch::empty({C}, torch::kFloat64)};
    double* mean = stats.mean.data_ptr<double>();
    double* variance = stats.variance.data_ptr<double>();
    double* inverse_std = stats.inverse_std.data_ptr<double>();
    std::vector<T> scale(C), beta_t(C);
    for (int64_t c = 0; c < C; ++c) {
      const double centre = sums.first[c] / count;
      variance[c] = std::max(sums.second[c] / count - centre * centre, 0.0);
      const double m = shift[c] + centre;
      const double s = 1.0 / std::sqrt(variance[c] + eps);
      mean[c] = m;
      inverse_std[c] = s;
      scale[c] = static_cast<T>(gamma[c] * s);
      beta_t[c] = static_cast<T>(beta[c]);
    }
    normalise_add_relu(input, shortcut, layout, SplitMean<T>(mean, C), scale, beta_t,
                       out.data_ptr<S>());
    return stats;
  }

  template <typename S, typename T = Arithmetic<S>>
  // The gradients of weight and bias, and with sum_dx the sum of dx per channel (else undefined),
  // float64.
  static std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> backward_kernel(
      const torch::Tensor& grad, const torch::Tensor& out, const torch::Tensor& x,
      const torch::Tensor& weight, const torch::Tensor& mean, const torch::Tensor& inverse_std,
      const Layout& layout, torch::Tensor& grad_x, torch::Tensor& grad_shortcut, bool sum_dx) {
    const int64_t C = layout.channels;
    const SplitMean<T> centre(mean.data_ptr<double>(), C);
    const auto sums = masked_gradient_sums(grad.data_ptr<S>(), out.data_ptr<S>(), x.data_ptr<S>(),
                                           layout, centre);
    const auto gamma = as_vector<double>(weight);
    const auto s = as_vector<double>(inverse_std);
    const auto count = static_cast<double>(layout.per_channel());
    auto grad_weight = torch::empty({C}, torch::kFloat64);
    auto grad_bias = torch::empty({C}, torch::kFloat64);
    double* dgamma = grad_weight.data_ptr<double>();
    double* dbeta = grad_bias.data_ptr<double>();
    std::vector<T> a(C), b(C), d(C);
    for (int64_t c = 0; c < C; ++c) {
      // d/dx of gamma * (x - mean) * s: gamma * s * (g - mean(g) - (x - mean) * s^2 *
      // mean(g * (x - mean))), with g the gradient through the ReLU.
      a[c] = static_cast<T>(gamma[c] * s[c]);
      b[c] = static_cast<T>(-gamma[c] * s[c] * s[c] * s[c] * sums.second[c] / count);
      d[c] = static_cast<T>(-gamma[c] * s[c] * sums.first[c] / count);
      dgamma[c] = sums.second[c] * s[c];
      dbeta[c] = sums.first[c];
    }
    const auto dx_sums =
        input_gradients(grad.data_ptr<S>(), out.data_ptr<S>(), x.data_ptr<S>(), layout, centre, a,
                        b, d, grad_x.data_ptr<S>(),
                        grad_shortcut.defined() ? grad_shortcut.data_ptr<S>() : nullptr, sum_dx);
    torch::Tensor grad_input_bias;
    if (sum_dx) {
      grad_input_bias = torch::empty({C}, torch::kFloat64);
      std::copy(dx_sums.first.begin(), dx_sums.first.begin() + C,
                grad_input_bias.data_ptr<double>());
    }
    return {grad_weight, grad_bias, grad_input_bias};
  }
};

}  // namespace

bool batch_norm_add_relu_applies(const torch::Tensor& x, const torch::Tensor& shortcut,
                                 const torch::Tensor& weight) {
  if (!x.defined() || x.dim() != 4 || !x.device().is_cpu()) return false;
  const auto type = x.scalar_type();
  if (type != torch::kFloat32 && type != torch::kFloat64 && type != torch::kBFloat16) return false;
  if (!x.is_contiguous() && !x.is_contiguous(at::MemoryFormat::ChannelsLast)) return false;
  // bf16 activations keep float32 parameters, as autocast leaves them.
  const auto parameter_type = type == torch::kBFloat16 ? torch::kFloat32 : type;
  if (weight.scalar_type() != parameter_type || weight.numel() != x.size(1)) return false;
  if (x.size(0) * x.size(2) * x.size(3) < 2) return false;  // LibTorch's own refusal says why
  if (shortcut.defined()) {
    if (shortcut.sizes() != x.sizes() || shortcut.scalar_type() != type ||
        !shortcut.device().is_cpu()) {
      return false;
    }
  }
  return true;
}

torch::Tensor batch_norm_add_relu(const torch::Tensor& x, const torch::Tensor& shortcut,
                                  const torch::Tensor& weight, const torch::Tensor& bias,
                                  torch::Tensor& running_mean, torch::Tensor& running_var,
                                  double momentum, double eps, const torch::Tensor& conv_bias) {
  TORCH_CHECK(batch_norm_add_relu_applies(x, shortcut, weight),
              "batch_norm_add_relu does not take x of ", x.sizes(), " (", x.scalar_type(),
              ") here: ask batch_norm_add_relu_applies first");
  const bool has_conv_bias = conv_bias.defined();
  TORCH_CHECK(!has_conv_bias || (conv_bias.dim() == 1 && conv_bias.size(0) == x.size(1) &&
                                 conv_bias.is_floating_point() && conv_bias.device().is_cpu()),
              "batch_norm_add_relu takes a conv_bias of x's ", x.size(1), " channels, got ",
              conv_bias.sizes());
  // The shortcut in x's layout, so one index serves both.
  const auto format = memory_format_of(layout_of(x));
  const bool has_shortcut = shortcut.defined();
  const auto aligned = has_shortcut ? shortcut.contiguous(format) : torch::empty({0}, x.options());
  return BatchNormAddRelu::apply(x, aligned, has_shortcut, weight, bias,
                                 has_conv_bias ? conv_bias : torch::empty({0}, weight.options()),
                                 has_conv_bias, running_mean, running_var, momentum, eps);
}

}  // namespace dptrain
