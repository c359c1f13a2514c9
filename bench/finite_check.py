#!/usr/bin/env python3
"""What the per-step non-finite check of the gradients costs on the CPU, two ways: LibTorch's
isfinite(g).all() and aminmax(g) (dptrain's check: lib/src/train/finite.cpp), at the gradient
counts of width 16 and width 64 (the book's 11,175,818). Medians of --repeats timed calls after
one untimed call, in the Python of the LibTorch to measure:

    /usr/bin/python3 bench/finite_check.py --threads 2
    .venv-torch/bin/python bench/finite_check.py --threads 2
"""
import argparse
import statistics
import time

import torch

COUNTS = {"width 16": 701_930, "width 64": 11_175_818}


def median_ms(call, repeats):
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    for label, count in COUNTS.items():
        g = torch.randn(count)
        old = median_ms(lambda: torch.isfinite(g).all(), args.repeats)
        new = median_ms(lambda: torch.aminmax(g), args.repeats)
        print(f"{label} ({count} gradients): isfinite().all() {old:.3f} ms, "
              f"aminmax {new:.3f} ms ({old / new:.1f}x)")


if __name__ == "__main__":
    main()
