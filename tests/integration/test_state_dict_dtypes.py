#!/usr/bin/env python3
"""What a PyTorch user saves, dptrain evaluates: the book's model trained a few
steps in PyTorch (tests/support/pytorch_resnet.py), its state dict saved with PyPI safetensors'
save_file in float32, float16, bfloat16 and float64 and without BatchNorm's num_batches_tracked,
each scored by `dptrain eval --model` with --logits, and by PyTorch on the very weights dptrain
holds (the file's values as float32). Each must give PyTorch's accuracy, argmax and logits
(within float32 rounding, as test_round_trip.py); the half types the float32 accuracy within
their rounding; the float64 and the buffer-less files the float32 file's line exactly; and the
notice that says what was converted, once. Not here: the refusals (test_three_readers.py,
tests/train/test_checkpoint.cpp).

    .venv-tests/bin/python3 tests/integration/test_state_dict_dtypes.py --dptrain build/app/dptrain

Prints one line per file. Needs Fashion-MNIST (as test_round_trip.py finds it).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.dont_write_bytecode = True
from pytorch_resnet import resnet18  # noqa: E402
import test_round_trip as round_trip  # noqa: E402  (its data search and IDX reader)

WIDTH, TRAIN_IMAGES, BATCH, LR, SEED = 4, 4096, 64, 0.05, 3  # 64 steps: about 2 s on 2 cores
TEST_LIMIT = 1000
# The half types round each weight to 11 (float16) or 8 (bfloat16) significant bits: a relative
# change of at most 2^-11 or 2^-8 per weight, which moves a logit by about that fraction of its
# scale and flips only the test images whose two largest logits are that close. 1% and 2% of the
# images are far above what this model's margins give (a few images) and far below what a wrong
# conversion costs (a weight read as bits of another type scores about 0.1).
HALF_ACCURACY_TOLERANCE = {"F16": 0.01, "BF16": 0.02}
NOTICE = "dptrain: --model {path}: its {dtype} weights converted to the model's F32 (exactly)"


def fail(message):
    print(f"error: state dict dtypes: {message}", file=sys.stderr)
    sys.exit(1)


def trained_model(data):
    """The book's model after TRAIN_IMAGES / BATCH steps of SGD in PyTorch, in eval mode."""
    torch.manual_seed(SEED)
    images = torch.from_numpy(round_trip.read_idx(
        os.path.join(data, "train-images-idx3-ubyte.gz"), TRAIN_IMAGES).copy())
    labels = torch.from_numpy(round_trip.read_idx(
        os.path.join(data, "train-labels-idx1-ubyte.gz"), TRAIN_IMAGES).copy()).long()
    model = resnet18(10, 1, WIDTH)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model.train()
    for start in range(0, TRAIN_IMAGES, BATCH):
        x = images[start:start + BATCH].unsqueeze(1).float() / 255
        loss = torch.nn.functional.cross_entropy(model(x), labels[start:start + BATCH])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def variants(state):
    """(label, the state dict to save) for each way a user saves it."""
    def floats(dtype):
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    return [("F32", state), ("F16", floats(torch.float16)), ("BF16", floats(torch.bfloat16)),
            ("F64", floats(torch.float64)),
            ("F32 without num_batches_tracked",
             {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")})]


def dptrain_eval(binary, data, path, logits_path):
    done = subprocess.run([binary, "eval", "--model", path, "--devices", "cpu", "--data-dir", data,
                           "--test-limit", str(TEST_LIMIT), "--logits", logits_path],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        fail(f"dptrain eval --model {path} exited {done.returncode}: {done.stderr.strip()}")
    found = re.fullmatch(r"test acc: ([0-9.]+), test loss \S+ \(([0-9]+) images\) on \S+\n",
                         done.stdout)
    if not found or int(found.group(2)) != TEST_LIMIT:
        fail(f"dptrain eval printed no accuracy over {TEST_LIMIT} images: {done.stdout!r}")
    notices = [line for line in done.stderr.splitlines() if "--model" in line]
    return done.stdout.strip(), float(found.group(1)), notices


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dptrain", required=True, help="the dptrain binary")
    args = parser.parse_args()
    data = next((d for d in round_trip.DATA_DIRS
                 if d and os.path.exists(os.path.join(d, round_trip.TEST_LABELS))), None)
    if data is None:
        fail("no Fashion-MNIST in $DPTRAIN_DATA, /usr/share/datasets/fashion-mnist or "
             "./data/fashion-mnist (apt-get install dataset-fashion-mnist)")
    model = trained_model(data)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    images = torch.from_numpy(round_trip.read_idx(
        os.path.join(data, round_trip.TEST_IMAGES), TEST_LIMIT).copy()).unsqueeze(1).float() / 255
    labels = torch.from_numpy(round_trip.read_idx(
        os.path.join(data, round_trip.TEST_LABELS), TEST_LIMIT).copy()).long()
    results = {}
    with tempfile.TemporaryDirectory(prefix="dptrain-state-dicts.") as work:
        for label, saved in variants(state):
            path = os.path.join(work, label.split()[0] + ("-nbt" if " " in label else "") +
                                ".safetensors")
            logits_path = os.path.join(work, "logits.safetensors")
            save_file(saved, path)
            line, acc, notices = dptrain_eval(args.dptrain, data, path, logits_path)
            dptrain_logits = load_file(logits_path)["logits"]
            # PyTorch on the weights dptrain holds: the file's values as float32, and num_batches
            # tracked at 0 where the file has none (as PyTorch's own load_state_dict sets it).
            reference = resnet18(10, 1, WIDTH)
            reference.load_state_dict({k: v.float() if v.is_floating_point() else v
                                       for k, v in load_file(path).items()}, strict=False)
            reference.eval()
            with torch.no_grad():
                logits = reference(images)
            pytorch_acc = int((logits.argmax(1) == labels).sum()) / TEST_LIMIT
            difference = (dptrain_logits - logits).abs().max().item()
            flips = (dptrain_logits.argmax(1) != logits.argmax(1)).nonzero().flatten().tolist()
            print(f"{label}: dptrain {line!r}; PyTorch on the same weights: test acc "
                  f"{pytorch_acc:.4f}; largest |logit difference| {difference:.3g}; notices "
                  f"{notices}")
            if flips or f"{pytorch_acc:.4f}" != f"{acc:.4f}":
                fail(f"{label}: accuracy {acc:.4f} in dptrain, {pytorch_acc:.4f} in PyTorch on the "
                     f"same weights (argmax differs on test images {flips[:10]})")
            if not difference <= round_trip.LOGIT_TOLERANCE:
                fail(f"{label}: logits differ by {difference:.3g} from PyTorch's on the same "
                     f"weights, more than {round_trip.LOGIT_TOLERANCE:g}")
            expected_notices = ([NOTICE.format(path=path, dtype=label)] if label in
                                HALF_ACCURACY_TOLERANCE else
                                [f"dptrain: --model {path}: its F64 weights converted to the "
                                 "model's F32 (F64 rounded to the nearest F32)"] if label == "F64"
                                else [f"dptrain: --model {path}: its 17 absent BatchNorm "
                                      "num_batches_tracked buffers set to 0, as PyTorch's "
                                      "load_state_dict sets them"] if " " in label else [])
            if notices != expected_notices:
                fail(f"{label}: notices {notices}, expected {expected_notices}")
            results[label] = (line, acc)
    f32_line, f32_acc = results["F32"]
    if f32_acc < 0.3:
        fail(f"the trained model scores {f32_acc:.4f}: too close to chance to compare")
    for label, tolerance in HALF_ACCURACY_TOLERANCE.items():
        if abs(results[label][1] - f32_acc) > tolerance:
            fail(f"{label}: test acc {results[label][1]:.4f}, the F32 file's {f32_acc:.4f}: more "
                 f"than {tolerance} apart")
    for label in ("F64", "F32 without num_batches_tracked"):
        if results[label][0] != f32_line:
            fail(f"{label}: {results[label][0]!r}, the F32 file's {f32_line!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
