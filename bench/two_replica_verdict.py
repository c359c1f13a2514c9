#!/usr/bin/env python3
"""Issue 28, the seeds: is dptrain's two-replica run (batch 512, lr 0.2, BatchNorm per replica)
behind the book's code, or is the gap chance? Reads the per-epoch records book_runs.py wrote for
the run "two" (one file per system and seed) and compares the last epoch's train loss of the two
systems over their seeds: the difference of the means with a bootstrap 95% interval, and the
Mann-Whitney rank test with its exact two-sided p-value (every split of the pooled seeds counted,
no normal approximation: with 8 + 8 seeds there are 12,870).

    /usr/bin/python3 bench/book_runs.py run --raw bench/results/two-replica-seeds \\
        --runs two --epochs 4 --seeds 0,1,2,3,4,5,6,7
    /usr/bin/python3 bench/two_replica_verdict.py --raw bench/results/two-replica-seeds \\
        --epochs 4 --out bench/results/<date>-cpu-two-replica-seeds.md
"""
import argparse
import itertools
import json
import os
import random
import statistics

import book_runs
from run_bench import cpu_model  # the bench's one reader of the CPU's name


def rank_sum_statistic(a, b):
    """Mann-Whitney U of a against b: pairs (x in a, y in b) with x > y, ties counting half."""
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)


def exact_mann_whitney(a, b):
    """U of a against b and the two-sided exact p: the share of all ways to split the pooled
    values into groups of len(a) and len(b) whose U is at least as far from its mean."""
    pooled = a + b
    observed = rank_sum_statistic(a, b)
    centre = len(a) * len(b) / 2
    extreme = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        picked = set(chosen)
        x = [pooled[i] for i in chosen]
        y = [pooled[i] for i in range(len(pooled)) if i not in picked]
        total += 1
        if abs(rank_sum_statistic(x, y) - centre) >= abs(observed - centre) - 1e-12:
            extreme += 1
    return observed, extreme / total


def bootstrap_interval(a, b, resamples=20000, seed=28):
    """95% percentile interval of mean(a) - mean(b), each group resampled on its own."""
    rng = random.Random(seed)
    diffs = sorted(statistics.fmean(rng.choices(a, k=len(a))) -
                   statistics.fmean(rng.choices(b, k=len(b))) for _ in range(resamples))
    return diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw", required=True, help="book_runs.py's per-job records")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the tables here (markdown) and beside it .json")
    args = parser.parse_args()
    book_runs.RAW = args.raw
    jobs = book_runs.load_jobs()
    by_system = {}
    for system in book_runs.SYSTEMS:
        key = (system, "two", args.width, args.threads, args.epochs)
        if key not in jobs:
            raise SystemExit(f"error: no {system} records for {key} in {args.raw}")
        by_system[system] = {seed: records for seed, records in sorted(jobs[key].items())
                             if len(records) == args.epochs}
    seeds = sorted(set(by_system["dptrain"]) & set(by_system["peer"]))
    if len(seeds) < 2:
        raise SystemExit(f"error: {len(seeds)} seed(s) finished by both systems in {args.raw}")
    lines = [f"# Two replicas, batch 512, lr 0.2: dptrain against the book's code over "
             f"{len(seeds)} seeds",
             "",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores. ResNet-18 width {args.width}, all 60,000/10,000 images, "
             f"{args.epochs} epochs, {args.threads} threads, seeds {seeds[0]}..{seeds[-1]}.",
             "",
             "    /usr/bin/python3 bench/book_runs.py run --raw " + args.raw + " --runs two "
             f"--epochs {args.epochs} --threads {args.threads} --width {args.width} "
             "--seeds " + ",".join(map(str, seeds)),
             "    /usr/bin/python3 bench/two_replica_verdict.py --raw " + args.raw +
             f" --epochs {args.epochs}" + (f" --out {args.out}" if args.out else ""),
             "",
             "Each system trains every seed from its own start (dptrain's generator, PyTorch's "
             "for the peer) on its own order; the two are compared as samples. The exact "
             "p-value counts every split of the pooled seeds.",
             "",
             "| epoch | measure | dptrain mean (min–max) | peer mean (min–max) | "
             "dptrain − peer, 95% bootstrap | Mann-Whitney U, exact p |",
             "|---|---|---|---|---|---|"]
    table = {"seeds": seeds, "epochs": args.epochs, "rows": []}
    for epoch in range(1, args.epochs + 1):
        for measure in ("train_loss", "test_acc"):
            a = [by_system["dptrain"][s][epoch - 1][measure] for s in seeds]
            b = [by_system["peer"][s][epoch - 1][measure] for s in seeds]
            u, p = exact_mann_whitney(a, b)
            lo, hi = bootstrap_interval(a, b)
            diff = statistics.fmean(a) - statistics.fmean(b)
            table["rows"].append({"epoch": epoch, "measure": measure, "dptrain": a, "peer": b,
                                  "difference": diff, "interval": [lo, hi], "u": u, "p": p})
            lines.append(f"| {epoch} | {measure.replace('_', ' ')} | "
                         f"{statistics.fmean(a):.3f} ({min(a):.3f}–{max(a):.3f}) | "
                         f"{statistics.fmean(b):.3f} ({min(b):.3f}–{max(b):.3f}) | "
                         f"{diff:+.3f} ({lo:+.3f} to {hi:+.3f}) | {u:g}, p = {p:.3f} |")
    lines += ["", "Per seed, the last epoch's train loss:", "",
              "| seed | dptrain | peer |", "|---|---|---|"]
    for s in seeds:
        lines.append(f"| {s} | {by_system['dptrain'][s][-1]['train_loss']:.4f} | "
                     f"{by_system['peer'][s][-1]['train_loss']:.4f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
