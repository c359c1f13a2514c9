// Times relu(batch_norm(x) + shortcut), forward and backward, fused (fused_batch_norm.h) against
// LibTorch's separate kernels, at the shapes of the book's ResNet-18 at a given width and batch.
// Prints the median of several repeats per shape, in milliseconds, and the ratio. With bf16, x,
// the shortcut and the gradients are bf16 (the parameters float32) and LibTorch's kernels run
// under bf16 autocast, as dptrain's step ran them before the fused path took bf16.
//   build/bench/fused_batch_norm_bench [width=16] [batch=256] [threads=2] [repeats=15]
//                                      [allocator=system|guarded] [precision=fp32|bf16]
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dptrain/core/cpu_allocator.h"
#include "dptrain/model/autocast.h"
#include "dptrain/model/fused_batch_norm.h"

namespace {

double time_ms(bool fused, const torch::Tensor& x0, bool with_shortcut) {
  const int64_t c = x0.size(1);
  auto x = x0.clone().requires_grad_();
  auto shortcut = with_shortcut ? x0.clone().requires_grad_() : torch::Tensor();
  auto weight = torch::ones({c}).requires_grad_();
  auto bias = torch::zeros({c}).requires_grad_();
  auto running_mean = torch::zeros({c});
  auto running_var = torch::ones({c});
  const auto upstream = torch::randn_like(x0);
  const dptrain::AutocastGuard autocast(torch::kCPU, x0.scalar_type() == torch::kBFloat16
                                                         ? dptrain::Amp::kBFloat16
                                                         : dptrain::Amp::kOff);
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor y;
  if (fused) {
    y = dptrain::batch_norm_add_relu(x, shortcut, weight, bias, running_mean, running_var, 0.1,
                                     1e-5);
  } else {
    y = torch::batch_norm(x, weight, bias, running_mean, running_var, true, 0.1, 1e-5, false);
    if (with_shortcut) y += shortcut;
    y.relu_();
  }
  y.backward(upstream);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t width = argc > 1 ? std::atoll(argv[1]) : 16;
  const int64_t batch = argc > 2 ? std::atoll(argv[2]) : 256;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 15;
  at::set_num_threads(threads);
  // "system" is the process's malloc: tcmalloc-minimal, linked as into dptrain (Note [CPU
  // memory: tcmalloc, not a cache of our own]); until 2026-12-05 the default named the caching
  // allocator that tcmalloc replaced, and the bench stopped at once.
  const std::string allocator = argc > 5 ? argv[5] : "system";
  dptrain::install_cpu_allocator(dptrain::parse_cpu_allocator(allocator));
  const std::string precision = argc > 6 ? argv[6] : "fp32";
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "error: precision must be fp32 or bf16, not %s\n", precision.c_str());
    return 2;
  }
  const auto type = precision == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  std::printf("width %lld, batch %lld, %d threads, median of %d, %s allocator, %s\n",
              static_cast<long long>(width), static_cast<long long>(batch), threads, repeats,
              allocator.c_str(), precision.c_str());
  std::printf("%-26s %-8s %10s %10s %7s\n", "shape", "layout", "libtorch", "fused", "ratio");
  for (const bool channels_last : {true, false}) {
    double total_lib = 0, total_fused = 0;
    for (const auto& [c, hw] : std::vector<std::pair<int64_t, int64_t>>{
             {width, 28}, {2 * width, 14}, {4 * width, 7}, {8 * width, 4}}) {
      for (const bool with_shortcut : {false, true}) {
        auto x = torch::randn({batch, c, hw, hw}).to(type);
        if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
        std::vector<double> lib, fused;
        for (int r = 0; r < repeats + 2; ++r) {  // two warm-up rounds
          const double a = time_ms(false, x, with_shortcut);
          const double b = time_ms(true, x, with_shortcut);
          if (r >= 2) {
            lib.push_back(a);
            fused.push_back(b);
          }
        }
        const double l = median(lib), f = median(fused);
        total_lib += l;
        total_fused += f;
        const std::string shape = "(" + std::to_string(batch) + "," + std::to_string(c) + "," +
                                  std::to_string(hw) + "," + std::to_string(hw) + ")" +
                                  (with_shortcut ? " +add" : "");
        std::printf("%-26s %-8s %10.3f %10.3f %7.2f\n", shape.c_str(),
                    channels_last ? "nhwc" : "nchw", l, f, l / f);
      }
    }
    std::printf("%-26s %-8s %10.3f %10.3f %7.2f\n", "sum", channels_last ? "nhwc" : "nchw",
                total_lib, total_fused, total_lib / total_fused);
  }
  return 0;
}
