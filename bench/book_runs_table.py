#!/usr/bin/env python3
"""A table of finished book runs (the per-epoch JSON lines dptrain's --metrics and
bench/book_peer.py write), one row per group of seeds: the final test accuracy, the mean test
accuracy of the last three epochs (the final epoch alone swings by a few points at lr 0.1), the
last epoch's train loss, each as mean (min-max), and the median seconds per epoch.

    bench/book_runs_table.py "LABEL=GLOB[;GLOB...]" ...

e.g. "dptrain bf16=bench/results/book-runs-bf16/dptrain-*-fused.jsonl"; several globs of one
group are joined with ';'.
"""
import glob
import json
import statistics
import sys


def summary(values):
    return f"{statistics.mean(values):.4f} ({min(values):.4f}–{max(values):.4f})"


def row(label, patterns):
    files = sorted(path for pattern in patterns.split(";") for path in glob.glob(pattern))
    pattern = patterns
    if not files:
        raise SystemExit(f"error: no file matches {pattern!r} (group {label!r})")
    finals, lasts, losses, seconds = [], [], [], []
    for path in files:
        with open(path) as lines:
            epochs = [json.loads(line) for line in lines if line.strip()]
        if len(epochs) < 3:
            raise SystemExit(f"error: {path} holds {len(epochs)} epochs; a finished run has 10")
        finals.append(epochs[-1]["test_acc"])
        lasts.append(statistics.mean(e["test_acc"] for e in epochs[-3:]))
        losses.append(epochs[-1]["train_loss"])
        seconds.append(statistics.median(e["seconds"] for e in epochs))
    return (f"| {label} | {len(files)} | {summary(finals)} | {summary(lasts)} | "
            f"{summary(losses)} | {statistics.median(seconds):.1f} |")


def main(groups):
    if not groups or any("=" not in g for g in groups):
        raise SystemExit("usage: " + __doc__.split("\n\n")[1].strip())
    rows = [row(*group.split("=", 1)) for group in groups]
    print("| run | seeds | final test acc | test acc, last 3 epochs | last train loss | s/epoch |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
