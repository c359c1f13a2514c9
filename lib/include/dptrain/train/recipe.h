// The training recipe beyond the book's: the optimizer's momentum and weight decay, the learning
// rate's schedule, label smoothing, augmentation, gradient clipping and the weights' moving
// average, as one plain record that the options carry, a checkpoint keeps and a resume compares.
// Every default is the book's, so that a run that sets none trains bit for bit as the book's.
// Not here: the flags (app/cli.cpp) or what applies each part (rank.cpp and the headers named).
#pragma once

#include <cstdint>
#include <string>

#include "dptrain/data/augment.h"
#include "dptrain/parallel/bucket_sgd.h"
#include "dptrain/train/lr_schedule.h"

namespace dptrain {

struct Recipe {
  SgdOptions sgd;                    // momentum, Nesterov, weight decay (parallel/bucket_sgd.h)
  LrSchedule schedule;               // the learning rate per step (lr_schedule.h)
  double label_smoothing = 0;        // the training loss's (Szegedy et al. 2016); 0 to < 1
  Augment augment = Augment::kNone;  // of the training images (data/augment.h)
  int64_t crop_padding = 2;          // kCropFlip: pixels of zeros around each image before the crop
  double clip_grad_norm = 0;         // > 0: the reduced gradient's 2-norm clipped to it; 0: never
  // > 0: evaluate and save an exponential moving average of the weights, decay in (0, 1)
  // (weight_average.h); 0: the weights themselves.
  double ema_decay = 0;
};

// Whether `recipe` is the book's (every default): what a checkpoint need not record.
bool is_book_recipe(const Recipe& recipe);

// The flags that give `recipe` beyond the book's, in the driver's words ("--momentum 0.9
// --nesterov --lr-schedule cosine --warmup-epochs 1"), or "the book's recipe": for the start
// line and for the resume's refusal of another recipe.
std::string recipe_flags(const Recipe& recipe);

// Checks the recipe's values and how they fit (Nesterov without momentum, a step schedule
// without its period, a decay outside (0, 1)); throws UsageError naming the flag.
void check_recipe(const Recipe& recipe);

}  // namespace dptrain
