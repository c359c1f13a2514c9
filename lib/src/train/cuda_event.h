// The CUDA event type of the LibTorch at hand, for the files of this layer that order streams
// or time work with events (cuda_graph_step.cpp, step_gpu_time.cpp). The wrapper moved from ATen
// to c10 (LibTorch 2.11 has only c10::cuda::CUDAEvent). Include it in a CUDA build only.
#pragma once

#if __has_include(<c10/cuda/CUDAEvent.h>)
#include <c10/cuda/CUDAEvent.h>
namespace dptrain {
using CudaEvent = c10::cuda::CUDAEvent;
}
#else
#include <ATen/cuda/CUDAEvent.h>
namespace dptrain {
using CudaEvent = at::cuda::CUDAEvent;
}
#endif
