// Whether tensors hold only finite values, as one cheap reduction per tensor. Not here: what a
// run does about a step that is not finite (the NonFiniteGuard in rank.cpp).
#pragma once

#include <torch/types.h>

#include <vector>

namespace dptrain {

// A () bool tensor on the tensors' device: true when no element of any of `tensors` is NaN or
// infinite. No host synchronisation. Note [Checking gradients with aminmax] in finite.cpp.
torch::Tensor all_finite(const std::vector<torch::Tensor>& tensors);

}  // namespace dptrain
