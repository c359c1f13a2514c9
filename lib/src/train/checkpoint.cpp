// Checkpoints and model files as safetensors (format version 3): the writer, the strict reader
// and the checks of a checkpoint's contents. See checkpoint.h; versions 1 and 2 are read by
// checkpoint_legacy.cpp.
#include "dptrain/train/checkpoint.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_legacy.h"
#include "checkpoint_run_state.h"
#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/core/safetensors.h"
#include "dptrain/core/sha256.h"
#include "dptrain/data/data.h"
#include "dptrain/model/model.h"
#include "dptrain/train/accepted_model.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/lr_schedule.h"
#include "dptrain/train/options.h"

namespace dptrain {
namespace {

using Json = nlohmann::json;

// The metadata keys of a version 3 file (docs/checkpoints.md lists them with their meaning).
constexpr char kFormatKey[] = "dptrain.format_version";
constexpr char kKindKey[] = "dptrain.kind";
constexpr char kRunStateKey[] = "dptrain.run_state";
constexpr char kDigestKey[] = "dptrain.digest";
constexpr char kDigestPrefix[] = "sha256:";

}  // namespace

namespace {

// ---- The content digest ------------------------------------------------------------------

// Note [A digest of the content, not of the bytes]
// safetensors carries no checksum, so a version 3 file carries its own in "dptrain.digest": the
// SHA-256 of the metadata (but the digest), sorted by key, then of every tensor sorted by name:
// its name, dtype, shape and bytes, each framed as a netstring ("5:hello,"). Nothing of the
// layout enters it (not the JSON's spacing or order, not the offsets), so a file that another
// tool rewrote with the same content verifies: PyPI safetensors' save_file, which orders the
// tensors by dtype, is tested (tests/integration/test_read_checkpoint.py).
// scripts/read_checkpoint.py computes the same. Names and shapes are covered, so two tensors
// whose names were swapped do not load as each other.
class ContentDigest {
 public:
  void text(const void* data, size_t size) {
    const std::string frame = std::to_string(size) + ":";
    sha_.update(frame);
    sha_.update(data, size);
    sha_.update(",", 1);
  }
  void text(const std::string& s) { text(s.data(), s.size()); }
  void raw(const void* data, size_t size) { sha_.update(data, size); }
  std::string hex() { return sha_.hex_digest(); }

 private:
  Sha256 sha_;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text;
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text;
}

// One tensor as the digest sees it: where its bytes are, wherever the file put them.
struct DigestedTensor {
  const std::string* name;
  torch::ScalarType dtype;
  const std::vector<int64_t>* shape;
  const uint8_t* bytes;
  size_t size;
};

std::string content_digest(const SafetensorsMetadata& metadata, std::vector<DigestedTensor> tensors) {
  ContentDigest digest;
  digest.raw("dptrain safetensors digest 1\n", 29);
  for (const auto& [key, value] : metadata) {  // std::map: by key, bytewise
    if (key == kDigestKey) continue;
    digest.text(key);
    digest.text(value);
  }
  digest.raw("\n", 1);
  std::sort(tensors.begin(), tensors.end(),
            [](const DigestedTensor& a, const DigestedTensor& b) { return *a.name < *b.name; });
  for (const auto& t : tensors) {
    digest.text(*t.name);
    digest.text(safetensors_dtype_name(t.dtype));
    digest.text(shape_text(*t.shape));
    digest.text(t.bytes, t.size);
  }
  return kDigestPrefix + digest.hex();
}

// The run state's JSON text from a version 3 file's metadata.
const std::string& run_state_of(const SafetensorsMetadata& metadata, const std::string& label) {
  const auto found = metadata.find(kRunStateKey);
  if (found == metadata.end()) {
    throw DataError(label + ": corrupt: no run state (" + kRunStateKey + ")");
  }
  return found->second;
}

// The metadata of a version 3 file but its digest: the run state, and facts for a person or a
// tool that never runs dptrain (safetensors' own metadata viewers show them).
SafetensorsMetadata metadata_of(const Checkpoint& c) {
  SafetensorsMetadata m;
  m["format"] = "pt";  // the tensors are PyTorch's (Hugging Face's convention for this key)
  m[kFormatKey] = std::to_string(kCheckpointFormatVersion);
  m[kKindKey] = c.kind == CheckpointKind::kModel ? "model" : "checkpoint";
  m[kRunStateKey] = run_state_text(c);
  m["dptrain.version"] = DPTRAIN_VERSION;
  m["dptrain.libtorch"] = TORCH_VERSION;
  m["dptrain.width"] = std::to_string(c.config.width);
  m["dptrain.num_classes"] = std::to_string(c.config.num_classes);
  m["dptrain.in_channels"] = std::to_string(c.config.in_channels);
  m["dptrain.epochs_done"] = std::to_string(c.epochs_done);
  m["dptrain.train_digest"] = c.config.train_digest;
  if (!c.history.empty()) m["dptrain.test_acc"] = figure_text(c.history.back().test_acc);
  return m;
}

// Note [Metadata that repeats the run state agrees with it]
// Of metadata_of's keys, six repeat the run state for viewers that never parse it (the width,
// classes, input channels, epochs done, training set's digest, last test accuracy). The digest
// covers them, but a file made to fit its digest could say "dptrain.width" 64 over a width-4 run
// state, or "dptrain.test_acc" 0.9999, and PyPI safetensors' metadata view showed the false
// figure while dptrain read the run state. Each such key, where present, must say what the run
// state says: the integers and the digest in metadata_of's very text ("064" is refused), the
// accuracy as a JSON number of exactly the run state's value (the writer's shortest-form text is
// nlohmann's, which is not every reader's; scripts/read_checkpoint.py applies the same rule), and
// "dptrain.test_acc" only after a finished epoch. The others ("dptrain.version",
// "dptrain.libtorch", "format") say who wrote the file, which nothing read can confirm or deny.
bool is_json_number(const std::string& text) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > start;
  };
  if (i < text.size() && text[i] == '-') ++i;
  if (i < text.size() && text[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < text.size() && text[i] == '.' && (++i, !digits())) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == text.size();
}

void check_repeated_metadata(const SafetensorsMetadata& metadata, const Checkpoint& c,
                             const std::string& label) {
  const SafetensorsMetadata expected = metadata_of(c);
  for (const char* key : {"dptrain.width", "dptrain.num_classes", "dptrain.in_channels",
                          "dptrain.epochs_done", "dptrain.train_digest", "dptrain.test_acc"}) {
    const auto found = metadata.find(key);
    if (found == metadata.end()) continue;
    const auto want = expected.find(key);
    if (want != expected.end()) {
      const std::string& text = found->second;
      if (text == want->second) continue;
      if (key == std::string("dptrain.test_acc") && is_json_number(text) &&
          std::strtod(text.c_str(), nullptr) == c.history.back().test_acc) {
        continue;
      }
    }
    throw DataError(label + ": corrupt: metadata " + key + " is \"" +
                    printable(found->second.substr(0, 80)) + "\" where the run state gives " +
                    (want == expected.end() ? std::string("none (no epoch is finished)")
                                            : "\"" + printable(want->second) + "\""));
  }
}

// A file that is neither DPTRNCKP nor plausibly safetensors (too short, a header length past the
// cap, no JSON object after it) is named foreign first; `first` holds min(9, size) bytes.
void check_not_foreign(const uint8_t* first, size_t available, uint64_t size,
                       const std::string& label) {
  uint64_t n = 0;
  for (size_t i = 0; i < 8 && i < available; ++i) n |= static_cast<uint64_t>(first[i]) << (8 * i);
  if (size < 10 || n > kMaxSafetensorsHeaderBytes || (available > 8 && first[8] != '{')) {
    throw DataError(label + ": not a dptrain checkpoint (neither a safetensors file nor " +
                    "dptrain's older DPTRNCKP format)");
  }
}

// The file's format version from its metadata, checked: 3, or a DataError saying why not.
void check_format_version(const SafetensorsMetadata& metadata, const std::string& label) {
  const auto found = metadata.find(kFormatKey);
  if (found == metadata.end()) {
    throw DataError(label + ": a safetensors file without dptrain's run state, not a checkpoint " +
                    "(dptrain eval --model reads the weights of such a file)");
  }
  const std::string& v = found->second;
  const bool digits = !v.empty() && v.size() < 10 &&
                      std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  if (digits && std::stoul(v) > kCheckpointFormatVersion) {
    throw DataError(label + ": format version " + v + ", written by a newer dptrain (or " +
                    "damaged); this one reads versions 1 to " +
                    std::to_string(kCheckpointFormatVersion));
  }
  if (v != std::to_string(kCheckpointFormatVersion)) {
    throw DataError(label + ": corrupt: format version '" + printable(v) + "'");
  }
}

}  // namespace

std::string checkpoint_content_digest(const SafetensorsHeader& header, const uint8_t* data) {
  std::vector<DigestedTensor> tensors;
  for (const auto& e : header.entries) {
    tensors.push_back({&e.name, e.dtype, &e.shape, data + e.begin,
                       static_cast<size_t>(e.end - e.begin)});
  }
  return content_digest(header.metadata, std::move(tensors));
}

namespace {

void check_digest(const SafetensorsHeader& header, const uint8_t* data, const std::string& label) {
  const auto found = header.metadata.find(kDigestKey);
  if (found == header.metadata.end()) throw DataError(label + ": corrupt: no digest (" + kDigestKey + ")");
  if (checkpoint_content_digest(header, data) != found->second) {
    throw DataError(label + ": corrupt: the content digest does not match (the file was damaged " +
                    "or changed after dptrain wrote it)");
  }
}

// `bytes` bytes for the file's `what`, or a DataError naming the file when the memory runs out
// (a bare std::bad_alloc would say neither what nor which file).
std::vector<uint8_t> allocate_for(uint64_t bytes, const std::string& label, const char* what) {
  try {
    return std::vector<uint8_t>(static_cast<size_t>(bytes));
  } catch (const std::bad_alloc&) {
    throw DataError(label + ": out of memory for " + what + " (" + std::to_string(bytes) +
                    " bytes) while reading it; free memory, or raise the process's limit " +
                    "(ulimit -v), and run again");
  }
}

// The tensors a file of the model of `width` must hold: the model's (model_tensor_specs).
std::shared_ptr<const ModelTensorSpecs> model_specs(int64_t width) {
  return model_tensor_specs(ResNetOptions{kNumClasses, /*in_channels=*/1, width});
}

// Note [A state dict from PyTorch is read as PyTorch reads it]
// A plain safetensors file (safetensors.torch.save_file(model.state_dict(), F)) is what a PyTorch
// user has, and `eval --model` reads it as the user's own strict load_state_dict would, where
// that is safe: a floating-point tensor of another floating dtype (F16, BF16, F64) is converted
// to the model's float32, as load_state_dict's copy_ converts it: exactly from F16 and BF16
// (every value of theirs is a float32), rounded to the nearest float32 from F64, and an F64 value
// beyond float32's range is refused, naming the tensor (it would turn into an infinity). A
// BatchNorm's num_batches_tracked may be absent: PyTorch's BatchNorm fills it with 0 when the
// state dict carries no version (safetensors keeps none), and dptrain does the same (its
// BatchNorm uses the buffer only without a momentum, which the book's model never has). Both are
// said once, in one notice line (ModelWeights::notice). Nothing else is loosened: an integer
// tensor where the model has floats, a shape of another model, a tensor the model lacks or one
// it has and the file does not are refused, naming the first. dptrain's own files (checkpoints
// and --save-model files, with their digest) hold exactly the model's tensors: any difference
// there is damage, and they stay exact.
enum class TensorRules { kExact, kStateDict };

constexpr char kOptionalBuffer[] = "num_batches_tracked";

bool is_float(torch::ScalarType dtype) { return c10::isFloatingType(dtype); }

bool optional_buffer(const std::string& name) {
  const size_t n = std::strlen(kOptionalBuffer);
  return name.size() >= n && name.compare(name.size() - n, n, kOptionalBuffer) == 0;
}

// The length of `name`'s optimizer-state prefix (kMomentumPrefix, kAveragePrefix), 0 without.
size_t state_prefix_length(const std::string& name) {
  for (const char* prefix : {kMomentumPrefix, kAveragePrefix}) {
    if (name.rfind(prefix, 0) == 0) return std::strlen(prefix);
  }
  return 0;
}

// What to do about a tensor the model does not have, by the commonest cause.
std::string extra_tensor_hint(const std::string& name) {
  if (name.rfind("module.", 0) == 0) {
    return " (a DataParallel or DDP wrapper's prefix 'module.': save model.module.state_dict())";
  }
  return " (save the state_dict of tests/support/pytorch_resnet.py's resnet18 of that width)";
}

// The header's tensors against those of the model of `width`, before the data is read: every
// name, dtype and shape, and no tensor more, under `rules` (Note [A state dict from PyTorch is
// read as PyTorch reads it]); a DataError naming the first tensor that is extra or differs, in
// the file's order, else the first the file lacks, in the model's.
void check_model_tensors(const SafetensorsHeader& header, int64_t width, TensorRules rules,
                         const std::string& label) {
  const auto spec = model_specs(width);
  const std::string model = "the width-" + std::to_string(width) + " model";
  // What to do is said for a plain file; in dptrain's own file a difference is damage.
  const bool state_dict = rules == TensorRules::kStateDict;
  std::set<std::string> present;
  for (const auto& e : header.entries) {
    // The optimizer's state in dptrain's own files: the prefix, then a tensor of the model's.
    const size_t prefix = state_dict ? 0 : state_prefix_length(e.name);
    const auto found = spec->by_name.find(e.name.substr(prefix));
    if (found == spec->by_name.end()) {
      throw DataError(label + ": holds tensor '" + printable(e.name) + "', which " + model +
                      " has not" + (state_dict ? extra_tensor_hint(e.name) : "") + "; not read");
    }
    const TensorSpec& want = *found->second;
    const bool converted = state_dict && is_float(want.dtype) && is_float(e.dtype);
    if ((want.dtype != e.dtype && !converted) || want.shape != e.shape) {
      throw DataError(label + ": tensor '" + printable(e.name) + "' is " +
                      safetensors_dtype_name(e.dtype) + "[" + shape_text(e.shape) + "], " +
                      model + "'s is " + safetensors_dtype_name(want.dtype) + "[" +
                      shape_text(want.shape) + "]" +
                      (!state_dict ? ""
                       : want.shape != e.shape
                           ? " (a model of another width or shape)"
                           : " (a floating-point tensor converts, an integer one does not)") +
                      "; not read");
    }
    if (prefix == 0) present.insert(e.name);
  }
  size_t missing = 0;
  const TensorSpec* first = nullptr;
  for (const auto& t : spec->tensors) {
    if (present.count(t.name) != 0) continue;
    if (state_dict && optional_buffer(t.name)) continue;
    if (missing++ == 0) first = &t;
  }
  if (first != nullptr) {
    throw DataError(label + ": has no tensor '" + printable(first->name) + "' of " + model +
                    (missing > 1 ? " (nor " + std::to_string(missing - 1) + " more)" : "") +
                    (state_dict ? " (save the whole state_dict, buffers included: "
                                  "model.state_dict(), not named_parameters())"
                                : "") +
                    "; not read");
  }
}

// A plain file's tensors as the model of `width` takes them (Note [A state dict from PyTorch is
// read as PyTorch reads it]): floating-point ones in the model's dtype, absent optional buffers
// as 0; what was done, for ModelWeights::notice ("" when nothing).
std::string as_model_tensors(NamedTensors& tensors, int64_t width, const std::string& label) {
  const auto spec = model_specs(width);
  std::set<std::string> converted;  // the files's dtypes that were converted, by name
  std::set<std::string> present;
  for (auto& [name, tensor] : tensors) {
    present.insert(name);
    const auto want = spec->by_name.at(name)->dtype;
    if (tensor.scalar_type() == want) continue;
    const auto from = tensor.scalar_type();
    auto to = tensor.to(want);
    if (!torch::isfinite(to).equal(torch::isfinite(tensor))) {
      throw DataError(label + ": tensor '" + printable(name) + "' holds a value of " +
                      safetensors_dtype_name(from) + " beyond " + safetensors_dtype_name(want) +
                      "'s range (it would be an infinity); not read");
    }
    converted.insert(safetensors_dtype_name(from));
    tensor = std::move(to);
  }
  size_t filled = 0;
  for (const auto& t : spec->tensors) {
    if (present.count(t.name) != 0) continue;
    tensors.emplace_back(t.name, torch::zeros(t.shape, torch::TensorOptions().dtype(t.dtype)));
    ++filled;
  }
  std::string notice;
  if (!converted.empty()) {
    std::string dtypes;
    for (const auto& d : converted) dtypes += (dtypes.empty() ? "" : " and ") + d;
    const bool rounded = converted.count("F64") != 0;
    notice = "its " + dtypes + " weights converted to the model's F32 (" +
             (rounded ? "F64 rounded to the nearest F32" : "exactly") + ")";
  }
  if (filled > 0) {
    notice += std::string(notice.empty() ? "" : "; ") + "its " + std::to_string(filled) +
              " absent BatchNorm " + kOptionalBuffer + " buffers set to 0, as PyTorch's " +
              "load_state_dict sets them";
  }
  return notice;
}

// A version 3 checkpoint from its checked header and data.
Checkpoint checkpoint_from(const SafetensorsHeader& header, const uint8_t* data,
                           const std::string& label) {
  check_format_version(header.metadata, label);  // a newer version is named before its digest
  check_digest(header, data, label);
  const auto kind = header.metadata.find(kKindKey);
  if (kind == header.metadata.end() || (kind->second != "model" && kind->second != "checkpoint")) {
    throw DataError(label + ": corrupt: " + kKindKey + " is neither \"checkpoint\" nor \"model\"");
  }
  Checkpoint c = parse_run_state(run_state_of(header.metadata, label), label);
  c.format_version = kCheckpointFormatVersion;
  c.kind = kind->second == "model" ? CheckpointKind::kModel : CheckpointKind::kCheckpoint;
  check_checkpoint_contents(c, label);
  check_repeated_metadata(header.metadata, c, label);
  for (auto& named : safetensors_tensors(header, data)) {
    (state_prefix_length(named.first) == 0 ? c.tensors : c.state).push_back(std::move(named));
  }
  check_checkpoint_tensors(c.tensors, label);
  check_checkpoint_tensors(c.state, label);
  return c;
}

// A version 3 file opened: its header read and checked against what the run accepts (Note [A
// file is bounded by what the run can use, not by its own word] in accepted_model.h), and its size
// checked against that model before the data is read.
struct OpenedFile {
  SafetensorsHeader header;
  std::vector<uint8_t> data;
};

// What a header says of its model: the width, and how its tensors must match that model's.
struct ClaimedModel {
  int64_t width = 0;
  TensorRules rules = TensorRules::kExact;
};

OpenedFile open_safetensors(const RegularFile& file,
                            const std::function<ClaimedModel(const SafetensorsHeader&)>& claimed,
                            const AcceptedModel& accepted, const std::string& label) {
  uint8_t first[8] = {};
  file.read_at(0, first, static_cast<size_t>(std::min<uint64_t>(file.size(), 8)));
  const uint64_t n = safetensors_header_bytes(first, file.size(), label);
  std::vector<uint8_t> json = allocate_for(n, label, "its header");
  file.read_at(8, json.data(), json.size());
  OpenedFile opened{parse_safetensors_header(json.data(), n, file.size(), label), {}};
  const ClaimedModel model = claimed(opened.header);
  const int64_t width = accepted_width(model.width, accepted, label);
  const uint64_t limit = checkpoint_size_limit(width, kNumClasses, 1);
  if (file.size() > limit) {
    throw DataError(label + ": " + std::to_string(file.size()) +
                    " bytes, more than a file of a width-" + std::to_string(width) +
                    " model can hold (at most " + std::to_string(limit) + "); not read");
  }
  if (accepted.model_tensors) check_model_tensors(opened.header, width, model.rules, label);
  opened.data = allocate_for(opened.header.data_bytes, label, "its tensors");
  file.read_at(opened.header.data_offset(), opened.data.data(), opened.data.size());
  return opened;
}

// The width a checkpoint's run state claims, for the size bound only (the digest and the
// contents are checked once the file is read; a damaged width only loosens the bound).
int64_t claimed_width(const SafetensorsHeader& header, const std::string& label) {
  check_format_version(header.metadata, label);
  return run_state_width(run_state_of(header.metadata, label), label);
}

// The width of a plain safetensors file's model: the stem convolution's output channels.
// (kMaxWidth bounds it here only for the message; accepted_width bounds what is read.)
int64_t stem_width(const SafetensorsHeader& header, const std::string& label) {
  for (const auto& e : header.entries) {
    if (e.name != kStemWeight) continue;
    if (e.shape.size() != 4 || e.shape[0] < 1 || e.shape[0] > kMaxWidth) {
      throw DataError(label + ": tensor '" + kStemWeight + "' has shape [" + shape_text(e.shape) +
                      "], not the stem convolution's [width, 1, 3, 3] of a dptrain model");
    }
    return e.shape[0];
  }
  const bool wrapped = std::any_of(header.entries.begin(), header.entries.end(),
                                   [](const SafetensorsEntry& e) {
                                     return e.name == std::string("module.") + kStemWeight;
                                   });
  throw DataError(label + ": has no tensor '" + kStemWeight + "' (the stem convolution of the " +
                  "book's ResNet-18 as dptrain and tests/support/pytorch_resnet.py name it)" +
                  (wrapped ? extra_tensor_hint("module.") : std::string()));
}

}  // namespace

// ---- Serialisation ---------------------------------------------------------------------

std::vector<uint8_t> serialize_checkpoint(const Checkpoint& c) {
  TORCH_CHECK(c.format_version == kCheckpointFormatVersion, "checkpoint: cannot write format version ",
              c.format_version, " (versions 1 and 2 are read, never written)");
  NamedTensors tensors;
  std::vector<std::vector<int64_t>> shapes;  // beside the tensors, for the digest's pointers
  for (const auto* part : {&c.tensors, &c.state}) {
    for (const auto& [name, tensor] : *part) {
      auto t = tensor.detach().to(torch::kCPU).contiguous();
      shapes.push_back(t.sizes().vec());
      tensors.emplace_back(name, std::move(t));
    }
  }
  std::vector<DigestedTensor> digested;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i].second;
    digested.push_back({&tensors[i].first, t.scalar_type(), &shapes[i],
                        static_cast<const uint8_t*>(t.data_ptr()),
                        static_cast<size_t>(t.numel()) * t.element_size()});
  }
  auto metadata = metadata_of(c);
  metadata[kDigestKey] = content_digest(metadata, std::move(digested));
  return serialize_safetensors(tensors, metadata);
}

Checkpoint parse_checkpoint(const std::vector<uint8_t>& bytes, const std::string& name) {
  const std::string label = "checkpoint " + name;
  if (is_legacy_checkpoint(bytes.data(), bytes.size())) {
    return parse_legacy_checkpoint(bytes.data(), bytes.size(), label);
  }
  check_not_foreign(bytes.data(), std::min<size_t>(bytes.size(), 9), bytes.size(), label);
  const uint64_t n = safetensors_header_bytes(bytes.data(), bytes.size(), label);
  const auto header = parse_safetensors_header(bytes.data() + 8, n, bytes.size(), label);
  return checkpoint_from(header, bytes.data() + header.data_offset(), label);
}

uint64_t checkpoint_size_limit(int64_t width, int64_t num_classes, int64_t in_channels) {
  // At 8 bytes an element: float64 is the widest dtype a file may hold; the model's tensors, and
  // beside them as much again for the momentum buffers and again for the averaged weights.
  constexpr uint64_t kCopies = 3;
  return 8 + kMaxSafetensorsHeaderBytes +
         8 * kCopies * model_elements_bound(width, num_classes, in_channels);
}

// ---- Files -------------------------------------------------------------------------------

void write_checkpoint_atomically(const Checkpoint& checkpoint, const std::string& path) {
  const auto bytes = serialize_checkpoint(checkpoint);
  write_file_atomically(path, bytes.data(), bytes.size(), "checkpoint " + path,
                        " (the previous checkpoints are untouched)");
}

namespace {

// A file's first 9 bytes (fewer when it is shorter): enough to tell DPTRNCKP from safetensors.
struct FirstBytes {
  uint8_t bytes[9] = {};
  size_t size = 0;
  explicit FirstBytes(const RegularFile& file)
      : size(static_cast<size_t>(std::min<uint64_t>(file.size(), sizeof bytes))) {
    file.read_at(0, bytes, size);
  }
  bool legacy() const { return is_legacy_checkpoint(bytes, size); }
};

}  // namespace

Checkpoint read_checkpoint(const std::string& path, const std::string& what) {
  return read_checkpoint(path, what, accepted_in_memory(/*model_tensors=*/false));
}

Checkpoint read_checkpoint(const std::string& path, const std::string& what,
                           const AcceptedModel& accepted) {
  const RegularFile file(path, what);
  const std::string& label = file.name();
  const FirstBytes first(file);
  if (first.legacy()) return read_legacy_checkpoint(file, accepted);
  check_not_foreign(first.bytes, first.size, file.size(), label);
  const auto opened = open_safetensors(
      file,
      [&](const SafetensorsHeader& header) {
        return ClaimedModel{claimed_width(header, label), TensorRules::kExact};
      },
      accepted, label);
  return checkpoint_from(opened.header, opened.data.data(), label);
}

ModelWeights read_model_weights(const std::string& path, const std::string& what,
                                const AcceptedModel& accepted) {
  const RegularFile file(path, what);
  const std::string& label = file.name();
  if (FirstBytes(file).legacy()) {
    auto c = read_legacy_checkpoint(file, accepted);
    return {std::move(c.tensors), c.config.width, ""};
  }
  bool from_dptrain = false;
  const auto opened = open_safetensors(
      file,
      [&](const SafetensorsHeader& header) {
        from_dptrain = header.metadata.count(kFormatKey) != 0;
        return from_dptrain ? ClaimedModel{claimed_width(header, label), TensorRules::kExact}
                            : ClaimedModel{stem_width(header, label), TensorRules::kStateDict};
      },
      accepted, label);
  if (from_dptrain) {
    auto c = checkpoint_from(opened.header, opened.data.data(), label);
    return {std::move(c.tensors), c.config.width, ""};
  }
  ModelWeights weights{safetensors_tensors(opened.header, opened.data.data()),
                       stem_width(opened.header, label), ""};
  if (accepted.model_tensors) {
    weights.notice = as_model_tensors(weights.tensors, weights.width, label);
  }
  return weights;
}

bool is_checkpoint_file(const RegularFile& file) {
  const FirstBytes first(file);
  if (first.size >= 8 && std::memcmp(first.bytes, "DPTRNCKP", 8) == 0) return true;
  try {
    const uint64_t n = safetensors_header_bytes(first.bytes, file.size(), file.name());
    std::string json(static_cast<size_t>(n), '\0');
    file.read_at(8, json.data(), json.size());
    const Json header = Json::parse(json);
    const auto metadata = header.find("__metadata__");
    if (metadata == header.end() || !metadata->is_object()) return false;
    const auto kind = metadata->find(kKindKey);
    return kind != metadata->end() && *kind == "checkpoint";
  } catch (const DataError&) {
    return false;
  } catch (const Json::exception&) {
    return false;
  }
}

void check_checkpoint_matches(const CheckpointConfig& saved, const CheckpointConfig& run,
                              const std::string& name) {
  std::string differences;
  const auto compare = [&](const char* flag, int64_t was, int64_t is) {
    if (was == is) return;
    differences += std::string(differences.empty() ? "" : ", ") + flag + " " + std::to_string(was) +
                   " (this run: " + std::to_string(is) + ")";
  };
  compare("--width", saved.width, run.width);
  compare("classes", saved.num_classes, run.num_classes);
  compare("input channels", saved.in_channels, run.in_channels);
  if (!differences.empty()) {
    throw UsageError("checkpoint " + name + " was written for another model: " + differences);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> evaluated_weights(const Checkpoint& checkpoint,
                                                                     const std::string& name) {
  // A --save-model file already holds what was evaluated, the average with --ema, as its model.
  if (checkpoint.config.recipe.ema_decay == 0 || checkpoint.kind == CheckpointKind::kModel) {
    return checkpoint.tensors;
  }
  std::vector<std::pair<std::string, torch::Tensor>> averaged;
  const std::string prefix = kAveragePrefix;
  for (const auto& [key, tensor] : checkpoint.state) {
    if (key.rfind(prefix, 0) == 0) averaged.emplace_back(key.substr(prefix.size()), tensor);
  }
  if (averaged.empty()) {
    throw DataError("checkpoint " + name + ": its recipe has --ema, and it holds no " + prefix +
                    " tensors (the averaged weights)");
  }
  return averaged;
}

std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : model.named_parameters()) {
    tensors.emplace_back(item.key(), item.value().detach().to(torch::kCPU).contiguous().clone());
  }
  for (const auto& item : model.named_buffers()) {
    tensors.emplace_back(item.key(), item.value().detach().to(torch::kCPU).contiguous().clone());
  }
  return tensors;
}

void load_model_tensors(torch::nn::Module& model,
                        const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::string& name) {
  torch::NoGradGuard no_grad;
  std::map<std::string, const torch::Tensor*> by_name;
  for (const auto& [key, tensor] : tensors) by_name[key] = &tensor;
  const auto load = [&](const std::string& key, torch::Tensor& target) {
    const auto found = by_name.find(key);
    if (found == by_name.end()) {
      throw DataError("checkpoint " + name + ": has no tensor '" + key + "'");
    }
    const auto& source = *found->second;
    if (source.sizes() != target.sizes() || source.scalar_type() != target.scalar_type()) {
      std::ostringstream what;
      what << "checkpoint " << name << ": tensor '" << key << "' is " << source.scalar_type()
           << source.sizes() << ", the model's is " << target.scalar_type() << target.sizes();
      throw DataError(what.str());
    }
    target.copy_(source);
  };
  size_t loaded = 0;
  for (auto& item : model.named_parameters()) {
    load(item.key(), item.value());
    ++loaded;
  }
  for (auto& item : model.named_buffers()) {
    load(item.key(), item.value());
    ++loaded;
  }
  if (by_name.size() != tensors.size()) {
    throw DataError("checkpoint " + name + ": a tensor name appears twice");
  }
  if (loaded != tensors.size()) {
    throw DataError("checkpoint " + name + ": holds " + std::to_string(tensors.size()) +
                    " tensors where the model has " + std::to_string(loaded));
  }
}

CheckpointConfig checkpoint_config(const TrainOptions& options, int64_t train_size, int world_size,
                                   const std::string& train_digest) {
  CheckpointConfig config;
  config.width = options.width;
  config.num_classes = kNumClasses;
  config.in_channels = 1;
  config.batch_size = options.batch_size;
  config.lr = options.lr;
  config.seed = options.seed;
  config.train_size = train_size;
  config.world_size = world_size;
  config.train_digest = train_digest;
  config.recipe = options.recipe;
  config.schedule_epochs = lr_is_constant(options.recipe.schedule) ? 0 : options.epochs;
  return config;
}

}  // namespace dptrain
