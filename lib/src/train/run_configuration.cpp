// The settings the ranks of a world compare at the rendezvous. See run_configuration.h.
#include "dptrain/train/run_configuration.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/train/options.h"

namespace dptrain {
namespace {

// The shortest text that reads back as the same double: 0.1 stays "0.1", and any two values
// that differ in one bit differ in text.
std::string exact(double value) {
  char text[40];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

std::string on_off(bool value) { return value ? "on" : "off"; }

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

std::vector<RunSetting> run_settings(const TrainOptions& options, const std::string& train_set,
                                     const std::string& test_set, const std::string& start) {
  return {
      {"--width", std::to_string(options.width)},
      {"--batch-size", std::to_string(options.batch_size)},
      {"--lr", exact(options.lr)},
      {"--seed", std::to_string(options.seed)},
      {"--epochs", std::to_string(options.epochs)},
      {"--max-steps", std::to_string(options.max_steps)},
      {"--sync-bn", on_off(options.sync_bn)},
      {"--memory-format", memory_format_name(options.memory_format)},
      {"--amp", options.amp == Amp::kBFloat16 ? "bf16" : "off"},
      {"--conv-bias-grad", options.fused_conv_bias_grad ? "fused" : "library"},
      {"--cuda-graph", on_off(options.cuda_graph)},
      {"--bucket-mb", exact(static_cast<double>(options.bucket_bytes) / (1024 * 1024))},
      {"--backend", backend_name(options.backend)},
      {"--on-nonfinite", options.on_nonfinite == NonFinite::kSkip ? "skip" : "stop"},
      {"--check-replicas", std::to_string(options.check_replicas_every)},
      {"--checkpoint-dir", options.checkpoint_dir ? "given" : "none"},
      // Only rank 0 writes these; one given to another rank alone would be ignored in silence.
      {"--save-model", options.save_model ? "given" : "none"},
      {"--metrics", on_off(has(options.driver_outputs, "--metrics"))},
      {"--plot", on_off(has(options.driver_outputs, "--plot"))},
      {"--tensorboard", on_off(has(options.driver_outputs, "--tensorboard"))},
      {"--checkpoint-every", std::to_string(options.checkpoint_every)},
      {"--checkpoint-every-steps", std::to_string(options.checkpoint_every_steps)},
      {"--resume", on_off(options.resume)},
      {"--fresh", on_off(options.fresh)},
      {"the training set", train_set},
      {"the test set", test_set},
      {"the start", start},
  };
}

std::string settings_text(const std::vector<RunSetting>& settings) {
  std::string text;
  for (const auto& [name, value] : settings) text += name + "=" + value + "\n";
  return text;
}

}  // namespace dptrain
