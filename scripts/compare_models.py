#!/usr/bin/env python3
"""Compares two models written by `dptrain train --save-model`: prints the largest absolute
difference over all parameters (and which), and exits 1 when it exceeds --tolerance.

    python3 scripts/compare_models.py a.safetensors b.safetensors --tolerance 1e-6 [--buffers]

The files are dptrain's safetensors files, read by read_checkpoint.py beside this script, which
checks their digest and run state and never executes anything in them (as torch.jit.load of an
archive could). Needs a Python with torch (Debian's python3-torch).
"""
import argparse
import os
import sys

import torch  # noqa: F401  (the state_dicts are torch tensors: without it, fail before reading)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # the import leaves no __pycache__ in the source tree
from read_checkpoint import CheckpointError, read_checkpoint, shown  # noqa: E402

# What marks a tensor as a BatchNorm buffer rather than a parameter (lib/src/model/batch_norm.cpp).
BUFFER_NAMES = ("running_mean", "running_var", "num_batches_tracked")


def is_buffer(name):
    return any(part in name for part in BUFFER_NAMES)


def parameters(path, buffers):
    """The parameters by name (and, with `buffers`, the buffers as float64, so that an integer
    count subtracts like the rest)."""
    tensors = {}
    for name, tensor in read_checkpoint(path)["state_dict"].items():
        if not is_buffer(name):
            tensors[name] = tensor
        elif buffers:
            tensors[name] = tensor.double()
    return tensors


def differing_shape(first, second):
    return next((k for k in first if first[k].shape != second[k].shape), None)


def largest_difference(a, b):
    return (a - b).abs().max().item() if a.numel() else 0.0  # max() of nothing is an error


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--buffers", action="store_true",
                        help="the BatchNorm buffers too (running statistics, batch counts)")
    args = parser.parse_args()
    try:
        first, second = parameters(args.first, args.buffers), parameters(args.second, args.buffers)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if first.keys() != second.keys():
        print("error: the models have different parameters", file=sys.stderr)
        return 1
    if not first:
        print("error: the models hold no parameters", file=sys.stderr)
        return 1
    shape = differing_shape(first, second)
    if shape is not None:
        print(f"error: the models' {shown(shape)} differ in shape: {list(first[shape].shape)} "
              f"and {list(second[shape].shape)}", file=sys.stderr)
        return 1
    worst, where = max((largest_difference(first[k], second[k]), k) for k in first)
    what = "parameters and buffers" if args.buffers else "parameters"
    print(f"max |difference| {worst:.3g} in {shown(where)} over {len(first)} {what}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
