#!/usr/bin/env python3
"""The comparison table of bench/gpu_check.sh: dptrain's runs (its --metrics JSON Lines) and the
PyTorch peer's (bench/pytorch_peer.py --epochs), epoch by epoch, with the median seconds of
epochs 2..N and the images/s ratios at the same precision (fp32 against the peer as the book
writes it, bf16 against the tuned peer). Plain Python: no torch needed.

    python3 bench/gpu_summary.py OUT_DIR
"""
import json
import os
import statistics
import sys

RUNS = [("dptrain fp32", "dptrain-fp32.jsonl"), ("dptrain bf16", "dptrain-bf16.jsonl"),
        ("peer book fp32", "peer-book.jsonl"), ("peer tuned bf16", "peer-tuned.jsonl")]


def read_epochs(path):
    """[(seconds, test_acc, images)] per epoch, or None when the file is missing or empty."""
    if not os.path.exists(path):
        return None
    epochs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if "epoch" not in record or "seconds" not in record:
                continue  # the peer's closing line
            images = record["images_per_second"] * record["seconds"]
            epochs.append((record["seconds"], record["test_acc"], images))
    return epochs or None


def steady(epochs):
    """Median seconds and images/s over epochs 2..N (epoch 1 when there is only one)."""
    rest = epochs[1:] or epochs
    seconds = statistics.median(e[0] for e in rest)
    return seconds, statistics.median(e[2] / e[0] for e in rest if e[0] > 0)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    runs = [(name, read_epochs(os.path.join(out, file))) for name, file in RUNS]
    present = [(name, epochs) for name, epochs in runs if epochs]
    if not present:
        print("no per-epoch records to compare")
        return
    print("\nPer epoch: training seconds (device synchronised) / test accuracy\n")
    print("| epoch | " + " | ".join(name for name, _ in present) + " |")
    print("|---" * (len(present) + 1) + "|")
    for i in range(max(len(epochs) for _, epochs in present)):
        cells = [f"{e[i][0]:.3f} / {e[i][1]:.4f}" if i < len(e) else "" for _, e in present]
        print(f"| {i + 1} | " + " | ".join(cells) + " |")
    print("\n| run | median s/epoch, epochs 2..N | images/s | mean s/epoch | final test acc |")
    print("|---|---|---|---|---|")
    rates = {}
    for name, epochs in present:
        seconds, rate = steady(epochs)
        rates[name] = rate
        mean = sum(e[0] for e in epochs) / len(epochs)
        print(f"| {name} | {seconds:.3f} | {rate:.0f} | {mean:.3f} | {epochs[-1][1]:.4f} |")
    for ours, peer in (("dptrain fp32", "peer book fp32"), ("dptrain bf16", "peer tuned bf16")):
        if ours in rates and peer in rates:
            print(f"\n{ours} / {peer}: {rates[ours] / rates[peer]:.2f}x the images/s")
    missing = [name for name, epochs in runs if not epochs]
    if missing:
        print("\nno records from: " + ", ".join(missing))


if __name__ == "__main__":
    main()
