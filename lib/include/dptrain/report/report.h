// What a person reads: the line after each epoch and the final line in the book's format,
// "test acc: 0.93, 13.2 sec/epoch on [cuda:0]". Not here: where the lines go.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dptrain/train/epoch_stats.h"

namespace dptrain {

// "epoch 3/10: train loss 0.3012, train acc 0.8891, test acc 0.8765, 13.2 s, 4545 img/s, 0.0382
// TFLOP/s, peak RSS 1.3 GiB" on the CPU; on CUDA, e.g. "..., 312 TFLOP/s (MFU 32%), GPU peak
// 12.1 GiB". The MFU appears where a peak is known (EpochStats::mfu), and each efficiency figure
// only where it is known: a resumed run's earlier epochs print without them. With a validation
// set, ", val acc 0.8812" follows the test accuracy.
std::string format_epoch_line(const EpochStats& stats);

// "test acc: 0.93, 13.2 sec/epoch on [cuda:0, cuda:1]": the last epoch's test accuracy and the
// mean training time per epoch, as the book's train function prints them. A run whose steps
// were timed (step_gpu_time.h) adds what the timer dropped: "...; GPU timer: 0 of 30 samples
// dropped".
std::string format_final_line(const TrainResult& result);

// "CUDA graph: one step is 712 nodes (kernels, copies, memsets: the launches one replay stands
// for), replayed 2340 times", once, for a --cuda-graph run whose node count is known; "" else.
std::string format_graph_line(const TrainResult& result);

// The median of `seconds` (one entry per epoch, in order) from the second epoch on: the steady
// pace, without the first epoch's cuDNN autotuning and allocator growth. nullopt with fewer
// than two epochs.
std::optional<double> steady_epoch_seconds(const std::vector<double>& seconds);

// "median of epochs 2-10: 0.93 sec/epoch (epoch 1: 3.1 s); the book's line below is the mean of
// epochs 1-10", printed before the final line, whose seconds are that mean (format_final_line);
// "" with fewer than two epochs.
std::string format_steady_line(const TrainResult& result);

// Where a GPU run's time goes, printed after the steady line: "GPU time per step: median 1.20 ms
// of 30 timed steps (CUDA events); wall time per step: median 2.40 ms (epochs 2-10): host-bound,
// the wall is 2.00x the GPU time". GPU-bound where the GPU time is at least 0.9 of the wall time,
// host-bound below 0.6, partly host-bound between. "" where no step was timed (the CPU).
std::string format_step_time_line(const TrainResult& result);

// Progress inside an epoch. The bar is for a terminal, redrawn in place by the caller:
// "epoch 2/10 [########............] 120/235  4512 img/s  loss 0.4123  acc 0.8512  ETA 0:21"
// (`bar_width` characters between the brackets). The line is the same figures for logs:
// "epoch 2/10 step 120/235: loss 0.4123, acc 0.8512, 4512 img/s, 21 s left". Neither holds a
// control character.
std::string format_progress_bar(const ProgressStats& progress, int bar_width);
std::string format_progress_line(const ProgressStats& progress);

// "test acc: 0.9012, test loss 0.2734 (10000 images) on [cpu, cpu]", for dptrain eval.
std::string format_eval_line(const EvalResult& result);

}  // namespace dptrain
