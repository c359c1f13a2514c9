#!/usr/bin/env python3
"""Compares two models written by `dptrain train --save-model`: prints the largest absolute
difference over all parameters (and which), and exits 1 when it exceeds --tolerance.

    /usr/bin/python3 scripts/compare_models.py a.pt b.pt --tolerance 1e-6 [--buffers]

Needs a Python with torch (Debian's python3-torch); torch.jit.load opens torch::save archives.
"""
import argparse
import sys

import torch


def parameters(path, buffers):
    model = torch.jit.load(path, map_location="cpu")
    tensors = dict(model.named_parameters())
    if buffers:
        tensors.update((name, b.double()) for name, b in model.named_buffers())
    return tensors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--buffers", action="store_true",
                        help="the BatchNorm buffers too (running statistics, batch counts)")
    args = parser.parse_args()
    first, second = parameters(args.first, args.buffers), parameters(args.second, args.buffers)
    if first.keys() != second.keys():
        print("error: the models have different parameters", file=sys.stderr)
        return 1
    worst, where = max(((first[k] - second[k]).abs().max().item(), k) for k in first)
    what = "parameters and buffers" if args.buffers else "parameters"
    print(f"max |difference| {worst:.3g} in {where} over {len(first)} {what}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
