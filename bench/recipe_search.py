#!/usr/bin/env python3
"""The validation-split search of issue 54: dptrain trains each configuration given (a line of
flags) with --val-split N and a --metrics file, one after another on the same CPU, and the table
gives each one's validation accuracy per epoch, its best and last, and its training seconds.
Choices are made on validation accuracy alone: the test accuracy is in the metrics files but not
in the table, so that it is read once, for the configuration chosen.
Not here: the time to a target accuracy against the PyTorch peer (bench/time_to_accuracy.py).

    /usr/bin/python3 bench/recipe_search.py --name cpu-recipe-search --val-split 5000 \\
        --common "--devices cpu --threads 2 --width 8 --epochs 4" \\
        --config "book=" --config "nesterov=--momentum 0.9 --nesterov --lr 0.05"

Writes <out>/<date>-<name>.md and its metrics files beside it (<date>-<name>/<label>.jsonl).
"""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from run_bench import cpu_flags, cpu_model  # noqa: E402

NOTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dptrain", default=os.path.join(ROOT, "build", "app", "dptrain"))
    p.add_argument("--common", default="", help="flags every configuration gets")
    p.add_argument("--config", action="append", required=True,
                   help="LABEL=FLAGS, one configuration; given after --common, so its flags win")
    p.add_argument("--val-split", type=int, default=5000)
    p.add_argument("--name", default="cpu-recipe-search")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    args.configs = []
    for entry in args.config:
        label, _, flags = entry.partition("=")
        if not label or "/" in label:
            p.error(f"--config {entry!r}: expected LABEL=FLAGS")
        args.configs.append((label, shlex.split(flags)))
    return args


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(args, label, flags, folder):
    metrics = os.path.join(folder, label + ".jsonl")
    command = [args.dptrain, "train", *shlex.split(args.common), "--val-split",
               str(args.val_split), *flags, "--metrics", metrics, "--quiet"]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"recipe_search: {label}: exit {done.returncode}: {done.stderr.strip()}")
    epochs = records(metrics)
    vals = [e["val_acc"] for e in epochs]
    return {"label": label, "flags": " ".join(flags), "command": shlex.join(command),
            "val_acc": vals, "best": max(vals), "last": vals[-1],
            "train_seconds": sum(e["seconds"] for e in epochs), "wall_seconds": wall}


def markdown(args, rows, when):
    flags = cpu_flags()
    noted = ", ".join(f"{f}: {'yes' if f in flags else 'no'}" for f in NOTED_FLAGS)
    lines = [f"# Recipe search on the validation split, {when}", "",
             f"`bench/recipe_search.py`: each configuration trained with `--val-split "
             f"{args.val_split}` (the same held-out images for every one), one after another.",
             f"Common flags: `{args.common}`.", "",
             f"CPU: {cpu_model()}, {os.cpu_count()} cores ({noted}).", "",
             "| configuration | its flags | val acc per epoch | best | last | train s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        per_epoch = " ".join(f"{v:.4f}" for v in r["val_acc"])
        lines.append(f"| {r['label']} | `{r['flags'] or '(none)'}` | {per_epoch} | "
                     f"{r['best']:.4f} | {r['last']:.4f} | {r['train_seconds']:.0f} |")
    lines += ["", "Commands:", ""] + [f"    {r['command']}" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv):
    args = parse_args(argv)
    when = datetime.date.today().isoformat()
    folder = os.path.join(args.out, f"{when}-{args.name}")
    os.makedirs(folder, exist_ok=True)
    rows = []
    for label, flags in args.configs:
        rows.append(run(args, label, flags, folder))
        print(f"{label}: val acc {' '.join(f'{v:.4f}' for v in rows[-1]['val_acc'])}",
              flush=True)
        with open(os.path.join(args.out, f"{when}-{args.name}.md"), "w") as f:
            f.write(markdown(args, rows, when))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
