#!/usr/bin/env python3
"""Compares two models written by `dptrain train --save-model`: prints the largest absolute
difference over all parameters (and which), and exits 1 when it exceeds --tolerance.

Exit status: 0, the models are equal within --tolerance; 1, they differ (the max line says by
how much); 2, they could not be compared: one `error:` line on stderr says why (a file dptrain
cannot have written, models of other parameters or shapes, a bad flag, or a fault of this script
itself), so that a caller never reads a crash as "they differ".

    python3 scripts/compare_models.py a.safetensors b.safetensors --tolerance 1e-6 [--buffers]

The files are dptrain's safetensors files, read by read_checkpoint.py beside this script, which
checks their digest and run state and never executes anything in them (as torch.jit.load of an
archive could). Needs a Python with torch (Debian's python3-torch).

Equal values are no difference, infinities and NaN included (a NaN where the other model holds
NaN too); a NaN against anything else is an infinite one, so it fails every tolerance. A model
holding non-finite values is named in a note line either way.
"""
import argparse
import math
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
    # check_weights=False: a NaN or an infinity is what this script must report, not refuse;
    # check_model=False: it compares whatever tensors two files hold, by name.
    state = read_checkpoint(path, check_weights=False, check_model=False)["state_dict"]
    for name, tensor in state.items():
        if not is_buffer(name):
            tensors[name] = tensor
        elif buffers:
            tensors[name] = tensor.double()
    return tensors


def differing_shape(first, second):
    return next((k for k in first if first[k].shape != second[k].shape), None)


def differences(a, b):
    """|a - b| element by element, never NaN: 0 where the values are equal (an inf equals the
    same inf) or both NaN, inf where only one is NaN. Plain |a - b| is NaN in both cases, and
    max() over tuples holding NaN keeps whichever came first, which once reported a model with
    a NaN tensor identical to a finite one."""
    a, b = a.double(), b.double()  # float32 and int64 counts are exact in float64
    same = (a == b) | (a.isnan() & b.isnan())
    gap = (a - b).abs().nan_to_num(nan=math.inf, posinf=math.inf)
    return torch.where(same, torch.zeros_like(gap), gap)


def largest_difference(a, b):
    return differences(a, b).max().item() if a.numel() else 0.0  # max() of nothing is an error


def nonfinite_count(tensors):
    return sum(int((~t.double().isfinite()).sum()) for t in tensors.values())


def tolerance(text):
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


# The exit statuses (the docstring): argparse's own usage error is COULD_NOT_COMPARE too.
EQUAL, DIFFER, COULD_NOT_COMPARE = 0, 1, 2


def compare(args):
    """Prints the largest difference and returns EQUAL or DIFFER, or prints one error line and
    returns COULD_NOT_COMPARE."""
    try:
        first, second = parameters(args.first, args.buffers), parameters(args.second, args.buffers)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return COULD_NOT_COMPARE
    if first.keys() != second.keys():
        print("error: the models have different parameters", file=sys.stderr)
        return COULD_NOT_COMPARE
    if not first:
        print("error: the models hold no parameters", file=sys.stderr)
        return COULD_NOT_COMPARE
    shape = differing_shape(first, second)
    if shape is not None:
        print(f"error: the models' {shown(shape)} differ in shape: {list(first[shape].shape)} "
              f"and {list(second[shape].shape)}", file=sys.stderr)
        return COULD_NOT_COMPARE
    # The first of the largest, in the files' order: no NaN can reach the comparison.
    worst, where = 0.0, next(iter(first))
    for name in first:
        difference = largest_difference(first[name], second[name])
        if difference > worst:
            worst, where = difference, name
    what = "parameters and buffers" if args.buffers else "parameters"
    print(f"max |difference| {worst:.3g} in {shown(where)} over {len(first)} {what}")
    for label, tensors in (("first", first), ("second", second)):
        count = nonfinite_count(tensors)
        if count:  # equal non-finite values are no difference, but never pass unmentioned
            print(f"note: the {label} model holds {count} non-finite value(s)")
    return EQUAL if worst <= args.tolerance else DIFFER


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--tolerance", type=tolerance, default=0.0,
                        help="the largest |difference| still counted equal (finite, >= 0)")
    parser.add_argument("--buffers", action="store_true",
                        help="the BatchNorm buffers too (running statistics, batch counts)")
    args = parser.parse_args()
    try:
        return compare(args)
    except Exception as e:  # noqa: BLE001  (a fault of this script is no verdict on the models)
        print(f"error: compare_models.py could not compare {args.first} and {args.second}: "
              f"{type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
        return COULD_NOT_COMPARE


if __name__ == "__main__":
    sys.exit(main())
