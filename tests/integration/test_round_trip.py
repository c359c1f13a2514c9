#!/usr/bin/env python3
"""The round trip: dptrain trains a few steps and saves the model; `dptrain
eval` scores it and writes its logits; PyTorch loads the very same file with PyPI safetensors'
load_file into the book's model (tests/support/pytorch_resnet.py, strict=True) and scores the same
test images. Both must give the same accuracy and argmax, and logits within float32 rounding.
Not here: the file format's own checks (test_read_checkpoint.py, tests/train/test_checkpoint.cpp).

    .venv-tests/bin/python3 tests/integration/test_round_trip.py --dptrain build/app/dptrain

Prints three lines: dptrain's accuracy, PyTorch's, the largest logit difference. Reads
Fashion-MNIST where dptrain finds it ($DPTRAIN_DATA, then Debian's dataset-fashion-mnist, then
./data/fashion-mnist) and hands that directory to dptrain too; without it, one error line.
"""
import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile

import numpy
import torch
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
sys.dont_write_bytecode = True
from pytorch_resnet import resnet18  # noqa: E402

DATA_DIRS = (os.environ.get("DPTRAIN_DATA"), "/usr/share/datasets/fashion-mnist",
             "data/fashion-mnist")
TEST_IMAGES, TEST_LABELS = "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"
# A run small enough for a 2-core machine (about 25 s) that learns: 128 steps of 64 images at
# width 8 reach a test accuracy of 0.64 (seed 3), so that the logits are far from ties. (32 steps
# of 128 at lr 0.1 reached 0.094: one class everywhere, BatchNorm's running statistics still
# behind the weights.)
TRAIN = ["--width", "8", "--train-limit", "4096", "--batch-size", "64", "--epochs", "2",
         "--lr", "0.05", "--seed", "3"]
TEST_LIMIT = 500
# Note [The logits' tolerance]
# dptrain and PyTorch run the same float32 arithmetic in other kernels (dptrain's channels-last
# convolutions and its fused BatchNorm against PyTorch 1.13's contiguous ones), so only the order
# of the sums differs. A float32 sum of n products is off by about sqrt(n) * 2^-24 of its
# magnitude when the order changes (n <= 9 * 64 = 576 here: ~1.4e-6), and some twenty layers,
# each renormalised by BatchNorm, add such errors up: ~3e-5 of the activations' scale. The logits
# of this run are at most about 10, so 1e-3 is ten times what rounding explains, and far below the
# smallest change a real mismatch makes (a wrong or transposed weight moves logits by 0.1 or more;
# test_pytorch_equivalence.cpp's kRtol 1e-4 is the same bound on a single batch).
LOGIT_TOLERANCE = 1e-3


def fail(message):
    print(f"error: round trip: {message}", file=sys.stderr)
    sys.exit(1)


def run(command):
    """The standard output of `command`, which must succeed."""
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=600)
    if done.returncode != 0:
        fail(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def read_idx(path, count):
    """The first `count` items of a gzipped IDX file of unsigned bytes, as a uint8 array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:3] != b"\0\0\x08":
        fail(f"{path}: not an IDX file of unsigned bytes")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(data[3])]
    start = 4 + 4 * len(dims)
    item = int(numpy.prod(dims[1:], dtype=numpy.int64))
    return numpy.frombuffer(data, numpy.uint8, count * item, start).reshape([count, *dims[1:]])


def pytorch_logits(model_path, images):  # images: (N, 1, 28, 28) float32
    """The book's model, built at the width the file records, its state_dict the file's tensors
    (strict: every name, no extra), in eval mode: logits (N, num_classes)."""
    with safe_open(model_path, "pt") as f:
        metadata = f.metadata()
    model = resnet18(int(metadata["dptrain.num_classes"]), int(metadata["dptrain.in_channels"]),
                     int(metadata["dptrain.width"]))
    model.load_state_dict(load_file(model_path), strict=True)
    model.eval()
    with torch.no_grad():
        return model(images)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dptrain", required=True, help="the dptrain binary")
    args = parser.parse_args()
    data = next((d for d in DATA_DIRS if d and os.path.exists(os.path.join(d, TEST_LABELS))), None)
    if data is None:
        fail("no Fashion-MNIST in $DPTRAIN_DATA, /usr/share/datasets/fashion-mnist or "
             "./data/fashion-mnist (apt-get install dataset-fashion-mnist)")
    common = ["--devices", "cpu", "--data-dir", data, "--test-limit", str(TEST_LIMIT)]
    with tempfile.TemporaryDirectory(prefix="dptrain-round-trip.") as work:
        model_path = os.path.join(work, "model.safetensors")
        logits_path = os.path.join(work, "logits.safetensors")
        run([args.dptrain, "train", *common, *TRAIN, "--save-model", model_path])
        out = run([args.dptrain, "eval", *common, "--model", model_path, "--logits", logits_path])
        found = re.search(r"test acc: ([0-9.]+), test loss \S+ \(([0-9]+) images\)", out)
        if not found or int(found.group(2)) != TEST_LIMIT:
            fail(f"dptrain eval printed no accuracy over {TEST_LIMIT} images: {out!r}")
        dptrain_acc = found.group(1)
        saved = load_file(logits_path)
        images = torch.from_numpy(read_idx(os.path.join(data, TEST_IMAGES), TEST_LIMIT).copy())
        labels = torch.from_numpy(read_idx(os.path.join(data, TEST_LABELS), TEST_LIMIT).copy())
        logits = pytorch_logits(model_path, images.unsqueeze(1).float() / 255)  # as dptrain: /255

    if not torch.equal(saved["labels"], labels.long()):
        fail("dptrain's labels are not the test set's first labels in order")
    if saved["logits"].dtype != torch.float32 or saved["logits"].shape != logits.shape:
        fail(f"dptrain's logits are {saved['logits'].dtype} {list(saved['logits'].shape)}, "
             f"PyTorch's {logits.dtype} {list(logits.shape)}")
    correct = int((logits.argmax(1) == labels.long()).sum())
    pytorch_acc = f"{correct / TEST_LIMIT:.4f}"
    difference = (saved["logits"] - logits).abs()
    print(f"dptrain eval: test acc {dptrain_acc} ({TEST_LIMIT} images)")
    print(f"PyTorch (safetensors.torch.load_file, the book's model): test acc {pytorch_acc} "
          f"({correct} of {TEST_LIMIT})")
    print(f"largest |logit difference|: {difference.max().item():.3g} (tolerance "
          f"{LOGIT_TOLERANCE:g})")
    flips = (saved["logits"].argmax(1) != logits.argmax(1)).nonzero().flatten().tolist()
    if flips:
        fail(f"the argmax differs on test images {flips[:10]}")
    if pytorch_acc != dptrain_acc:
        fail(f"accuracy {dptrain_acc} in dptrain, {pytorch_acc} in PyTorch")
    if not difference.max().item() <= LOGIT_TOLERANCE:
        fail(f"logits differ by {difference.max().item():.3g} (image "
             f"{int(difference.max(1).values.argmax())}), more than {LOGIT_TOLERANCE:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
