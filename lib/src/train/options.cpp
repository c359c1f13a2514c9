// The one check of how the options fit together. See options.h.
#include "dptrain/train/options.h"

#include "dptrain/core/errors.h"

namespace dptrain {

void check_checkpoint_options(const TrainOptions& options) {
  if (options.resume && !options.checkpoint_dir) {
    throw UsageError("--resume needs --checkpoint-dir, where the checkpoints are");
  }
  if (options.fresh && !options.checkpoint_dir) {
    throw UsageError("--fresh needs --checkpoint-dir, whose checkpoints it removes");
  }
  if (options.checkpoint_every_steps > 0 && !options.checkpoint_dir) {
    throw UsageError("--checkpoint-every-steps needs --checkpoint-dir, where the checkpoints go");
  }
  if (options.fresh && options.resume) {
    throw UsageError("--fresh and --resume exclude each other: start over, or continue");
  }
}

}  // namespace dptrain
