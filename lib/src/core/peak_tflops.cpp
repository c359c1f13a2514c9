// The peak table of NVIDIA data-centre GPUs and the MFU against a peak. See peak_tflops.h.
#include "dptrain/core/peak_tflops.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace dptrain {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Note [The peak table]
// One row per name CUDA gives a GPU, with NVIDIA's own figures for it in TFLOP/s: plain fp32 (the
// CUDA cores), and the tensor cores' TF32 and bf16, dense. NVIDIA's datasheets print the tensor
// figures with 2:4 structured sparsity (marked "*"), twice the dense rate; a convolution is
// dense, so the table holds half of them, as torchtitan's and llm.c's MFU do. A GPU that is not
// here (consumer cards, Volta and older, whose tensor cores have no TF32 or bf16) gets no MFU
// unless --peak-tflops says its peak. A name must match exactly: a different variant of a GPU
// (PCIe against SXM, NVL) has a different clock and power limit, hence a different peak.
struct PeakRow {
  const char* name;  // cudaDeviceProp::name
  double fp32, tf32, bf16;
};

constexpr PeakRow kPeaks[] = {
    // NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column
    // (https://www.nvidia.com/en-us/data-center/h200/): FP32 67, TF32 989*, BF16 1,979*.
    {"NVIDIA H200", 67.0, 494.5, 989.5},
    // NVIDIA H100 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h100/),
    // H100 SXM: FP32 67, TF32 989*, BF16 1,979*; H100 PCIe: FP32 51, TF32 756*, BF16 1,513*.
    {"NVIDIA H100 80GB HBM3", 67.0, 494.5, 989.5},
    {"NVIDIA H100 PCIe", 51.0, 378.0, 756.5},
    // NVIDIA A100 Tensor Core GPU datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/
    // Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), the same for the
    // 40 and 80 GB SXM and PCIe cards: FP32 19.5, TF32 156 (312*), BF16 312 (624*).
    {"NVIDIA A100-SXM4-80GB", 19.5, 156.0, 312.0},
    {"NVIDIA A100-SXM4-40GB", 19.5, 156.0, 312.0},
    {"NVIDIA A100 80GB PCIe", 19.5, 156.0, 312.0},
    {"NVIDIA A100-PCIE-40GB", 19.5, 156.0, 312.0},
    // NVIDIA A30 Tensor Core GPU datasheet
    // (https://www.nvidia.com/en-us/data-center/products/a30-gpu/):
    // FP32 10.3, TF32 82 (165*), BF16 165 (330*).
    {"NVIDIA A30", 10.3, 82.0, 165.0},
    // NVIDIA A10 Tensor Core GPU datasheet
    // (https://www.nvidia.com/en-us/data-center/products/a10-gpu/):
    // FP32 31.2, TF32 62.5 (125*), BF16 125 (250*).
    {"NVIDIA A10", 31.2, 62.5, 125.0},
    // NVIDIA L40S GPU datasheet (https://www.nvidia.com/en-us/data-center/l40s/): FP32 91.6,
    // TF32 183 (366*), BF16 362.05 (733*).
    {"NVIDIA L40S", 91.6, 183.0, 362.05},
    // NVIDIA L4 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/l4/):
    // FP32 30.3, TF32 120*, BF16 242*.
    {"NVIDIA L4", 30.3, 60.0, 121.0},
};

}  // namespace

std::string peak_precision_name(PeakPrecision precision) {
  switch (precision) {
    case PeakPrecision::kBFloat16:
      return "bf16";
    case PeakPrecision::kTf32:
      return "TF32";
    case PeakPrecision::kFloat32:
      return "fp32";
  }
  return "?";
}

std::optional<double> table_peak_tflops(const std::string& gpu_name, PeakPrecision precision) {
  for (const auto& row : kPeaks) {
    if (gpu_name != row.name) continue;
    switch (precision) {
      case PeakPrecision::kBFloat16:
        return row.bf16;
      case PeakPrecision::kTf32:
        return row.tf32;
      case PeakPrecision::kFloat32:
        return row.fp32;
    }
  }
  return std::nullopt;
}

double model_flops_utilization(double tflops, double peak_tflops, int64_t world_size) {
  const double mfu = tflops / (peak_tflops * static_cast<double>(world_size));
  return mfu >= 0 && mfu <= 1 ? mfu : kNaN;
}

}  // namespace dptrain
