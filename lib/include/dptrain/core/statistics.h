// Summary statistics over a run's samples, for every layer that reports them (the epoch's GPU
// time in train/, the result line's step times in report/).
// Not here: the samples themselves (step_gpu_time.h, rank.cpp) or their formatting (report.h).
#pragma once

#include <vector>

namespace dptrain {

// The median of `values`, NaN when empty.
double median_or_nan(std::vector<double> values);

}  // namespace dptrain
