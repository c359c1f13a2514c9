#!/usr/bin/env python3
"""dptrain against its PyTorch peer (bench/pytorch_peer.py), in one run, on CPU.

For each configuration the two alternate (dptrain, peer, dptrain, peer, ...) for --repeats
rounds after one warm-up round, each run training a fixed number of steps at width 16 with
the same thread count; the bench reports the median training images/s of each, sec/epoch
(60,000 images at that rate) and the ratio dptrain/peer. It writes JSON and a Markdown table
into bench/results/, with the machine, the versions and the exact command.

    /usr/bin/python3 bench/run_bench.py --dptrain build/app/dptrain

Needs a Python with torch for the peer: Debian's python3-torch is the same LibTorch 1.13 that
Debian's libtorch-dev builds dptrain against.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EPOCH_LINE = re.compile(r"^epoch \d+/\d+: .*, ([0-9.]+) s, ([0-9.]+) img/s$", re.M)


def run_dptrain(args, replicas):
    devices = ",".join(["cpu"] * replicas)
    command = [args.dptrain, "train", "--devices", devices, "--width", str(args.width),
               "--batch-size", str(args.batch_size), "--lr", "0.1", "--epochs", "1",
               "--max-steps", str(args.steps), "--train-limit", str(args.steps * args.batch_size),
               "--test-limit", "256", "--threads", str(args.threads), "--data-dir", args.data_dir]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    seconds, rate = EPOCH_LINE.search(output).groups()
    return float(rate)


def run_peer(args, replicas):
    command = [sys.executable, os.path.join(HERE, "pytorch_peer.py"), "--width", str(args.width),
               "--batch-size", str(args.batch_size), "--steps", str(args.steps),
               "--replicas", str(replicas), "--threads", str(args.threads),
               "--data-dir", args.data_dir]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])["images_per_second"]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description="dptrain against its PyTorch peer, on CPU")
    parser.add_argument("--dptrain", default=os.path.join(HERE, "..", "build", "app", "dptrain"))
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--replicas", default="1,2", help="comma list of replica counts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()

    rows = []
    for replicas in [int(r) for r in args.replicas.split(",")]:
        dptrain_rates, peer_rates = [], []
        for round_index in range(args.repeats + 1):  # round 0 warms caches and is not counted
            a = run_dptrain(args, replicas)
            b = run_peer(args, replicas)
            print(f"replicas {replicas} round {round_index}: dptrain {a:.1f} img/s, "
                  f"peer {b:.1f} img/s", flush=True)
            if round_index > 0:
                dptrain_rates.append(a)
                peer_rates.append(b)
        d, p = statistics.median(dptrain_rates), statistics.median(peer_rates)
        rows.append({"replicas": replicas, "dptrain_images_per_second": d,
                     "peer_images_per_second": p, "ratio": d / p,
                     "dptrain_sec_per_epoch": 60000 / d, "peer_sec_per_epoch": 60000 / p,
                     "dptrain_runs": dptrain_rates, "peer_runs": peer_rates})

    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    host = platform.node() or "host"
    record = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "host": host},
        "versions": {"peer_torch": torch.__version__, "python": platform.python_version()},
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "settings": {"width": args.width, "batch_size": args.batch_size, "steps": args.steps,
                     "threads": args.threads, "repeats": args.repeats},
        "results": rows,
    }
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"{stamp}-cpu-width{args.width}")
    with open(base + ".json", "w") as f:
        json.dump(record, f, indent=2)
    with open(base + ".md", "w") as f:
        f.write(f"# dptrain against the PyTorch peer, CPU, {record['date']}\n\n")
        f.write(f"Machine: {record['machine']['cpu']}, {record['machine']['cores']} cores. "
                f"Peer: PyTorch {torch.__version__}. Width {args.width}, batch "
                f"{args.batch_size}, {args.steps} steps a run, {args.threads} threads, median "
                f"of {args.repeats} alternating runs after one warm-up round.\n\n")
        f.write("| replicas | dptrain img/s | peer img/s | dptrain/peer | dptrain sec/epoch | "
                "peer sec/epoch |\n|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['replicas']} | {r['dptrain_images_per_second']:.1f} | "
                    f"{r['peer_images_per_second']:.1f} | {r['ratio']:.2f} | "
                    f"{r['dptrain_sec_per_epoch']:.0f} | {r['peer_sec_per_epoch']:.0f} |\n")
        f.write(f"\nCommand: `{record['command']}`\n")
    print(open(base + ".md").read())


if __name__ == "__main__":
    main()
