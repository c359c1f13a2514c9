#!/usr/bin/env python3
"""dptrain's training step with the recipe flags against the same step in PyTorch as a PyTorch
user writes it (bench/recipe_peer.py: torch.optim.SGD with momentum, Nesterov and weight decay in
two parameter groups, the schedule's rate, CrossEntropyLoss(label_smoothing), clip_grad_norm_,
AveragedModel) on the book's model (tests/support/pytorch_resnet.py). dptrain trains 33 steps and
writes a checkpoint after the last two; PyTorch loads the first (weights, buffers, momentum
buffers, the EMA) and takes step 33 on dptrain's batch and crops (tests/support/dptrain_draws.py).
Every tensor of dptrain's second checkpoint must equal PyTorch's to float32 rounding, measured
against how far the step moved it (Note [The tolerance of the replay]). Three runs: one replica
with momentum, Nesterov, weight decay off the norms and biases, one-cycle with a warm-up and
label smoothing; two replicas with --sync-bn, adding clipping (at a bound the step's norm
exceeds), crop-and-flip and the EMA; one replica as the first, in --recipe fast's step
(channels-last, --conv-bias-grad fused), where the CPU has AVX2 (below it channels-last is
refused, and the run says it did not run).
One step from a trained state: from the book's N(0, 0.01) start a change of 1e-7 in the weights
grows to a difference of order one within a few steps at lr 0.1, so a longer replay would compare
chaos, not code (bench/results/2026-12-07-recipe-against-pytorch.md).

    .venv-tests/bin/python3 tests/integration/test_recipe_against_pytorch.py --dptrain build/app/dptrain

Prints one line per run: the largest difference as a share of the tolerance and of the step's
change, and the tensor it was found in.
Needs torch and Fashion-MNIST ($DPTRAIN_DATA or /usr/share/datasets/fashion-mnist).
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.dont_write_bytecode = True
import torch  # noqa: E402
from torch import nn  # noqa: E402

import dptrain_draws as draws  # noqa: E402
import recipe_peer as peer  # noqa: E402
from pytorch_peer import load_set  # noqa: E402
from pytorch_resnet import resnet18  # noqa: E402

DATA_DIRS = (os.environ.get("DPTRAIN_DATA"), "/usr/share/datasets/fashion-mnist",
             "data/fashion-mnist")
WIDTH, BATCH, LR, SEED = 4, 64, 0.1, 11
# 700 images: 11 steps an epoch, the last of 60 images. dptrain trains 33 of the 44 steps of 4
# epochs, writing a checkpoint after step 32 (epoch 3's step 10, counted from 0) and after the
# last; the replay takes the state of the first and trains the short batch of step 33, at 12/38
# of the base rate (one-cycle: T = 44 steps, a warm-up of W = 6).
TRAIN_LIMIT, EPOCHS, STEPS = 700, 4, 33
SGD = ["--momentum", "0.9", "--nesterov", "--weight-decay", "5e-4",
       "--weight-decay-skip-norm-bias", "--lr-schedule", "onecycle", "--warmup-epochs", "0.5",
       "--label-smoothing", "0.1"]
RUNS = [
    ("one replica: momentum, Nesterov, weight decay, one-cycle, label smoothing",
     ["--devices", "cpu", *SGD]),
    ("two replicas, --sync-bn: the same and clipping, crop-flip, the EMA",
     ["--devices", "cpu,cpu", "--sync-bn", *SGD, "--clip-grad-norm", "0.2", "--augment",
      "crop-flip", "--crop-padding", "3", "--ema", "0.9"]),
    ("one replica, --recipe fast's step: channels-last and the fused conv bias gradients",
     ["--devices", "cpu", *SGD, "--memory-format", "channels-last", "--conv-bias-grad", "fused"]),
]
# Note [The tolerance of the replay]
# From the same state, the two steps differ by the order of float32 sums alone (dptrain's
# strided 1x1 convolution, its BatchNorm over replicas, its fused SGD over buckets): on LibTorch
# 1.13 the largest difference was 8e-5 of a tensor's change in the step (a momentum buffer; the
# weights 3e-5, one or two units in their last place). A difference of recipe is far larger:
# weight decay on a BatchNorm weight adds 5e-4 to a gradient whose buffer changes by about 7e-3
# (7 %), label smoothing 0.1 changes every gradient by about a tenth, Nesterov or a schedule off
# by a step change the update by a large part of itself.
# Where a step changes a tensor by a few units in the last place of its values (the EMA of a
# BatchNorm weight near 1 moves by about 1e-5, some 100 units), rounding is a larger part of the
# change: a difference of ULPS units of the tensor's largest value is allowed besides.
TOLERANCE, ULPS, FLOAT32_EPSILON = 1e-3, 4, 2.0 ** -23
# A convolution's bias before a BatchNorm gets a gradient of zero but for rounding (the
# BatchNorm takes each channel's mean away, bias and all), so its change is rounding on both
# sides and is not compared: the stem's and each block's conv1 and conv2 (the shortcut's conv3
# is added after the BatchNorm and is compared).
NOT_COMPARED = re.compile(r"(^|\.)(0|conv1|conv2)\.bias$")


def fail(message):
    print(f"error: recipe against PyTorch: {message}", file=sys.stderr)
    sys.exit(1)


def data_dir():
    for folder in DATA_DIRS:
        if folder and os.path.exists(os.path.join(folder, "train-images-idx3-ubyte.gz")):
            return folder
    fail("no Fashion-MNIST in " + ", ".join(d for d in DATA_DIRS if d))


def read_safetensors(path):
    """{name: tensor} of a safetensors file of F32 and I64 tensors."""
    with open(path, "rb") as f:
        raw = f.read()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + size])
    dtypes = {"F32": torch.float32, "I64": torch.int64}
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        data = bytearray(raw[8 + size + begin:8 + size + end])
        tensors[name] = torch.frombuffer(data, dtype=dtypes[entry["dtype"]]).view(entry["shape"])
    return tensors


# dptrain's flags that are not the recipe's (the PyTorch side runs its own default layout and
# conv bias gradients), each with its value if it takes one.
NOT_RECIPE = {"--devices": 1, "--sync-bn": 0, "--memory-format": 1, "--conv-bias-grad": 1}


def peer_args(flags):
    """recipe_peer's parsed flags for dptrain's recipe `flags`."""
    recipe, i = [], 0
    while i < len(flags):
        if flags[i] in NOT_RECIPE:
            i += 1 + NOT_RECIPE[flags[i]]
            continue
        recipe.append(flags[i])
        i += 1
    return peer.parser().parse_args(["--width", str(WIDTH), "--batch-size", str(BATCH), "--lr",
                                     str(LR), "--epochs", str(EPOCHS), *recipe])


def replay_step(args, before, images, labels):
    """PyTorch's step from dptrain's checkpoint `before` (the state after global step
    STEPS - 1): the step's batch and crops from dptrain's draws, the schedule's rate of that
    step; returns the state as dptrain's checkpoint names it (weights and buffers, momentum.*,
    ema.*) and the step's clipping norm or None."""
    model = resnet18(10, 1, WIDTH, inplace=True)
    model.load_state_dict({k: v for k, v in before.items() if "." in k and
                           k.split(".")[0] not in ("momentum", "ema")})
    optimizer = peer.make_optimizer(model, args)
    steps_per_epoch = math.ceil(labels.numel() / BATCH)
    step = STEPS - 1  # 0-based global step
    epoch, in_epoch = divmod(step, steps_per_epoch)
    for group in optimizer.param_groups:
        group["lr"] = LR * peer.lr_factor(step, steps_per_epoch, EPOCHS, args.lr_schedule,
                                          args.warmup_epochs)
    names = dict((id(p), n) for n, p in model.named_parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            optimizer.state[p]["momentum_buffer"] = before["momentum." + names[id(p)]].clone()
    averaged = None
    if args.ema > 0:
        averaged = peer.ema_model(model, args.ema)
        averaged.module.load_state_dict({k[4:]: v for k, v in before.items()
                                         if k.startswith("ema.")})
        averaged.n_averaged.fill_(step)  # the updates so far: AveragedModel's count
    order = draws.epoch_order(labels.numel(), SEED, epoch)
    index = order[in_epoch * BATCH:(in_epoch + 1) * BATCH]
    x, y = images[index].float() / 255, labels[index]
    if args.augment == "crop-flip":
        dy, dx, flip = draws.crop_flip_draws(SEED, epoch, in_epoch, y.numel(), args.crop_padding)
        x = peer.crop_flip(x, dx, dy, flip, args.crop_padding)
    loss = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = None
    if args.clip_grad_norm > 0:
        norm = float(nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm))
    optimizer.step()
    if averaged is not None:
        averaged.update_parameters(model)
    after = dict(model.state_dict())
    for group in optimizer.param_groups:
        for p in group["params"]:
            after["momentum." + names[id(p)]] = optimizer.state[p]["momentum_buffer"]
    if averaged is not None:
        after.update(("ema." + k, v) for k, v in averaged.module.state_dict().items())
    return after, norm


def checkpoint_at(folder, step, steps_per_epoch):
    epoch, in_epoch = divmod(step, steps_per_epoch)
    path = os.path.join(folder, f"checkpoint-e{epoch:04d}-s{in_epoch:06d}.safetensors")
    if not os.path.exists(path):
        fail(f"dptrain wrote no {path} (it wrote {sorted(os.listdir(folder))})")
    return read_safetensors(path)


def compare(what, flags, dptrain, folder, scratch):
    checkpoints = os.path.join(scratch, "checkpoints")
    command = [dptrain, "train", "--data-dir", folder, "--width", str(WIDTH), "--batch-size",
               str(BATCH), "--lr", str(LR), "--epochs", str(EPOCHS), "--seed", str(SEED),
               "--train-limit", str(TRAIN_LIMIT), "--test-limit", "64", "--threads", "2",
               "--max-steps", str(STEPS), "--checkpoint-every-steps", str(STEPS - 1),
               "--checkpoint-dir", checkpoints, "--quiet", *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        fail(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    steps_per_epoch = math.ceil(TRAIN_LIMIT / BATCH)
    before = checkpoint_at(checkpoints, STEPS - 1, steps_per_epoch)
    saved = checkpoint_at(checkpoints, STEPS, steps_per_epoch)

    args = peer_args(flags)
    images, labels = load_set(folder, "train", TRAIN_LIMIT).tensors
    expected, norm = replay_step(args, before, images, labels)
    if norm is not None and norm <= args.clip_grad_norm:
        fail(f"{what}: the clipping bound {args.clip_grad_norm} did not bite (norm {norm})")
    missing = sorted(set(expected) - set(saved))
    if missing:
        fail(f"{what}: dptrain's checkpoint lacks {missing}")
    worst, where, relative = 0.0, None, 0.0
    for name, value in expected.items():
        if not value.is_floating_point():
            if not torch.equal(saved[name], value):
                fail(f"{what}: {name} is {saved[name].tolist()}, PyTorch's {value.tolist()}")
            continue
        if NOT_COMPARED.search(name):
            continue
        moved = (value.double() - before[name].double()).abs().max().item()
        if moved == 0:
            fail(f"{what}: the step left {name} unchanged: nothing to compare")
        difference = (saved[name].double() - value.double()).abs().max().item()
        allowed = TOLERANCE * moved + ULPS * FLOAT32_EPSILON * value.abs().max().item()
        if difference / allowed > worst:
            worst, where, relative = difference / allowed, name, difference / moved
    print(f"{what}: largest difference {worst:.2f} of the tolerance, {relative:.2e} of the "
          f"step's change ({where})")
    if worst > 1:
        fail(f"{what}: {where} differs from PyTorch's by {relative:.2e} of the step's change, "
             f"over the tolerance")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dptrain", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = data_dir()
    with open("/proc/cpuinfo") as f:
        avx2 = " avx2" in f.read()
    for what, flags in RUNS:
        if "channels-last" in flags and not avx2:
            print(f"{what}: not run, as dptrain refuses channels-last below AVX2")
            continue
        with tempfile.TemporaryDirectory() as scratch:
            compare(what, flags, args.dptrain, folder, scratch)
    print("every run matched PyTorch's")


if __name__ == "__main__":
    main()
