#!/usr/bin/env python3
"""The PyTorch peer of issue 54's recipes: the book's ResNet-18 on Fashion-MNIST trained with
dptrain's recipe flags (bench/recipe_flags.py) written as a PyTorch user writes them --
torch.optim.SGD with momentum, Nesterov and weight decay (param groups without the norm and bias
parameters on request), LambdaLR over the schedule's factor stepped after every optimizer step,
CrossEntropyLoss(label_smoothing=...), the crop-and-flip augmentation on each batch's tensor
(one gather, no PIL, no per-image loop), clip_grad_norm_, AveragedModel(use_buffers=True) for
the EMA -- and tuned as bench/pytorch_peer.py's tuned peer: --threads, --channels-last,
--inplace, --amp bf16 (and --compile on torch 2.x, whose compilation counts in epoch 1). The
whole set sits in memory; each epoch's order is one randperm.
It evaluates after every epoch and prints one JSON line per epoch (epoch, seconds of training,
eval_seconds of the test and validation evaluations, test_acc, val_acc, ...) and a last one
with "summary": true. bench/time_to_accuracy.py runs it beside dptrain.
Not here: several replicas (bench/pytorch_peer.py), dptrain's own images: --val-split holds out
as many images as dptrain does, by a fixed seed of its own, not the same ones, and the
augmentation draws its own offsets.

    /usr/bin/python3 bench/recipe_peer.py --width 4 --train-limit 512 --test-limit 256 \
        --epochs 2 --momentum 0.9 --nesterov --lr-schedule onecycle --warmup-epochs 0.5 \
        --augment crop-flip --label-smoothing 0.1 --ema 0.99 --val-split 128 --threads 1
"""
import argparse
import json
import math
import os
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import swa_utils

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from pytorch_peer import init_weights, load_set  # noqa: E402  (also puts tests/support on the path)
from pytorch_resnet import resnet18  # noqa: E402
from recipe_flags import add_recipe_flags  # noqa: E402

# The validation images are chosen by this seed whatever --seed is, so that every seed of a
# comparison holds out the same images (as dptrain does with its own fixed seed).
VAL_SPLIT_SEED = 54
IMAGE_SIZE = 28  # Fashion-MNIST's height and width; the crop returns to it


# ---- The schedule ------------------------------------------------------------------------------

def lr_factor(step, steps_per_epoch, epochs, schedule, warmup_epochs=0.0, step_epochs=0,
              gamma=0.1):
    """The factor of the base learning rate at global step `step` (0-based), as dptrain's
    --lr-schedule defines it (docs/flags.md): a linear warm-up over W = round(F*S) steps, then
    constant 1, step G^floor(s/(N*S)), cosine 0.5*(1+cos(pi*(s-W)/(T-W))) or onecycle
    (T-s)/(T-W), with S steps an epoch and T = epochs*S."""
    total = epochs * steps_per_epoch
    # round half away from zero, as C++'s std::round (Python's round() goes to the even one)
    # (no longer than the run, as dptrain's lr_schedule.cpp caps it)
    warmup = min(total, int(math.floor(warmup_epochs * steps_per_epoch + 0.5)))
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "step":
        return gamma ** (step // (step_epochs * steps_per_epoch)) if step_epochs > 0 else 1.0
    if total <= warmup:  # no steps after the warm-up: nothing to decay
        return 1.0
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
    if schedule == "onecycle":
        return (total - step) / (total - warmup)
    raise ValueError(f"unknown --lr-schedule {schedule}")


def make_optimizer(model, args):
    """SGD over one group, or two when the norm and bias parameters get no decay: every
    parameter of one dimension is a BatchNorm weight or bias or a layer's bias."""
    params = list(model.parameters())
    if args.weight_decay > 0 and args.weight_decay_skip_norm_bias:
        groups = [{"params": [p for p in params if p.ndim > 1]},
                  {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]
    else:
        groups = [{"params": params}]
    return torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                           weight_decay=args.weight_decay)


def make_scheduler(optimizer, steps_per_epoch, args):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(
        step, steps_per_epoch, args.epochs, args.lr_schedule, args.warmup_epochs,
        args.lr_step_epochs, args.lr_step_gamma))


# ---- The augmentation --------------------------------------------------------------------------

def crop_flip(images, dx, dy, flip, padding):
    """Each image of images (N, C, H, W) zero-padded by `padding`, cropped back to (H, W) at
    column offset dx[n] and row offset dy[n] (0..2*padding; `padding` is the image itself) and
    mirrored left-right where flip[n]: one gather for the whole batch. Any dtype."""
    n, c, h, w = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))  # (N, C, H+2P, W+2P)
    rows = dy[:, None] + torch.arange(h)  # (N, H)
    columns = torch.arange(w).expand(n, w)
    columns = dx[:, None] + torch.where(flip[:, None], w - 1 - columns, columns)  # (N, W)
    # the offset of output pixel (i, j) of image n within its padded image: (N, C, H*W)
    index = (rows[:, :, None] * (w + 2 * padding) + columns[:, None, :]).reshape(n, 1, h * w)
    cropped = padded.reshape(n, c, -1).gather(2, index.expand(n, c, h * w))
    return cropped.reshape(n, c, h, w)


def random_crop_flip(images, padding, generator):
    """crop_flip with offsets uniform in 0..2*padding and a flip with probability 1/2, drawn
    from `generator`."""
    n = images.shape[0]
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    flip = torch.randint(0, 2, (n,), generator=generator).bool()
    return crop_flip(images, dx, dy, flip, padding)


# ---- The moving average ------------------------------------------------------------------------

def ema_decay(decay, count):
    """dptrain's decay at its global step t (Note [The averaged weights' decay] in
    lib/include/dptrain/train/weight_average.h): min(decay, (1 + t) / (10 + t)). AveragedModel
    copies at its first update and passes the updates so far, `count`, from the second on: the
    update after step t = count sees that count."""
    return min(decay, (1 + count) / (10 + count))


def ema_model(model, decay):
    """AveragedModel over parameters and buffers: averaged = d*averaged + (1-d)*weights with
    dptrain's warmed-up d (ema_decay); the first update copies. On torch 2.x a multi_avg_fn (one
    foreach lerp per dtype, as get_ema_multi_avg_fn does; it also averages num_batches_tracked,
    which evaluation does not read); torch 1.13 has no multi_avg_fn, so there a per-tensor
    avg_fn, the integer buffers copied as dptrain copies them."""
    if hasattr(swa_utils, "get_ema_multi_avg_fn"):
        def average_all(averaged, current, count):
            d = ema_decay(decay, int(count))
            torch._foreach_lerp_(averaged, current, 1 - d)
        return swa_utils.AveragedModel(model, multi_avg_fn=average_all, use_buffers=True)

    def average(averaged, current, count):
        if not averaged.is_floating_point():
            return current
        d = ema_decay(decay, int(count))
        return d * averaged + (1 - d) * current
    return swa_utils.AveragedModel(model, avg_fn=average, use_buffers=True)


# ---- The data and the evaluation ---------------------------------------------------------------

def split_validation(images, labels, count):
    """(train images, train labels, val images, val labels): `count` images chosen by
    VAL_SPLIT_SEED held out of the training set."""
    generator = torch.Generator().manual_seed(VAL_SPLIT_SEED)
    order = torch.randperm(labels.numel(), generator=generator)
    held, kept = order[:count].sort().values, order[count:].sort().values
    return images[kept], labels[kept], images[held], labels[held]


def evaluate(model, images, labels, batch_size, memory_format, amp):
    """(accuracy, mean plain cross-entropy) of `model` on images (N, 1, 28, 28) uint8."""
    if labels.numel() == 0:
        return None, None
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for begin in range(0, labels.numel(), batch_size):
            x = (images[begin:begin + batch_size].float() / 255).contiguous(
                memory_format=memory_format)
            y = labels[begin:begin + batch_size]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                logits = model(x)
            loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
    model.train()
    return correct / labels.numel(), loss / labels.numel()


# ---- Training ----------------------------------------------------------------------------------

def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    order_generator = torch.Generator().manual_seed(args.seed)
    augment_generator = torch.Generator().manual_seed(args.seed + 1)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    amp = args.amp == "bf16"

    images, labels = load_set(args.data_dir, "train", args.train_limit).tensors
    if not 0 <= args.val_split < labels.numel():
        sys.exit(f"error: --val-split {args.val_split} leaves no training images of "
                 f"{labels.numel()}")
    images, labels, val_images, val_labels = split_validation(images, labels, args.val_split)
    test_images, test_labels = load_set(args.data_dir, "t10k", args.test_limit).tensors
    steps_per_epoch = math.ceil(labels.numel() / args.batch_size)  # the last batch may be short

    model = resnet18(10, 1, args.width, inplace=args.inplace)
    model.apply(init_weights)
    model = model.to(memory_format=memory_format)
    averaged = ema_model(model, args.ema) if args.ema > 0 else None
    # --compile: the training forward under torch.compile (2.x); the evaluation runs the module
    # eagerly, so that eval mode costs no second compilation. Compiling counts in epoch 1's time.
    forward = torch.compile(model) if args.compile else model
    optimizer = make_optimizer(model, args)
    scheduler = make_scheduler(optimizer, steps_per_epoch, args)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)

    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        order = torch.randperm(labels.numel(), generator=order_generator)
        loss_sum, correct = 0.0, 0
        for begin in range(0, labels.numel(), args.batch_size):
            index = order[begin:begin + args.batch_size]
            x, y = images[index], labels[index]  # (B, 1, 28, 28) uint8, (B,)
            if args.augment == "crop-flip":
                x = random_crop_flip(x, args.crop_padding, augment_generator)
            x = (x.float() / 255).contiguous(memory_format=memory_format)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                logits = forward(x)
            loss = criterion(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if args.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            optimizer.step()
            lr = optimizer.param_groups[0]["lr"]  # the rate this step used
            scheduler.step()
            if averaged is not None:
                averaged.update_parameters(model)
            loss_sum += loss.item() * y.numel()
            correct += (logits.argmax(1) == y).sum().item()
        seconds = time.perf_counter() - start

        start = time.perf_counter()
        scored = averaged if averaged is not None else model
        test_acc, test_loss = evaluate(scored, test_images, test_labels, args.batch_size,
                                       memory_format, amp)
        val_acc, val_loss = evaluate(scored, val_images, val_labels, args.batch_size,
                                     memory_format, amp)
        eval_seconds = time.perf_counter() - start
        print(json.dumps({
            "epoch": epoch, "seconds": seconds, "eval_seconds": eval_seconds,
            "test_acc": test_acc, "val_acc": val_acc, "test_loss": test_loss,
            "val_loss": val_loss, "train_loss": loss_sum / labels.numel(),
            "train_acc": correct / labels.numel(), "steps": epoch * steps_per_epoch,
            "lr": lr}), flush=True)  # lr: the rate of the epoch's last step
    print(json.dumps({"summary": True, "epochs": args.epochs, "test_acc": test_acc,
                      "val_acc": val_acc, "train_images": labels.numel(),
                      "val_images": val_labels.numel(), "steps_per_epoch": steps_per_epoch,
                      "torch": torch.__version__, "threads": args.threads,
                      "channels_last": args.channels_last, "amp": args.amp,
                      "compile": args.compile, "ema": args.ema > 0}), flush=True)


def parser():
    p = argparse.ArgumentParser(description="PyTorch peer of dptrain's training recipes")
    p.add_argument("--data-dir", default=os.environ.get("DPTRAIN_DATA") or
                   "/usr/share/datasets/fashion-mnist")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-limit", type=int, default=None)
    p.add_argument("--test-limit", type=int, default=None)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--amp", choices=["off", "bf16"], default="off")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--inplace", action="store_true",
                   help="ReLUs and the shortcut's sum in place, as dptrain's model")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the training forward (PyTorch 2.x)")
    add_recipe_flags(p)
    return p


def main():
    args = parser().parse_args()
    if args.lr_schedule == "step" and args.lr_step_epochs <= 0:
        sys.exit("error: --lr-schedule step needs --lr-step-epochs N > 0")
    train(args)


if __name__ == "__main__":
    main()
