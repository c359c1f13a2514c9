#!/usr/bin/env python3
"""dptrain against the PyTorch peers a user would pick, on the CPU, in one run.

The contestants (each with 1 and 2 replicas, the same width, global batch and thread count):
  dptrain-1.13     dptrain built on Debian's LibTorch 1.13 (build/), its default layout
  dptrain-2.11     dptrain built on PyPI's LibTorch 2.11 (build-211/), its default layout
  peer-V-book      bench/pytorch_peer.py on PyTorch V as the book writes it: contiguous,
                   out-of-place ReLUs
  peer-V-tuned     the same with PyTorch's CPU tuning: channels-last, and the in-place ReLUs
                   and shortcut sum that dptrain's model uses
  peer-2.11-compiled  the tuned peer under torch.compile (Inductor)
V is 1.13 (Debian's /usr/bin/python3) and 2.11 (--python-211, a venv with torch==2.11.0).
With --precisions fp32,bf16 each of them runs again in bf16, named with a "-bf16" suffix:
dptrain with --amp bf16, the peers with bf16 autocast over the forward pass (PyTorch's AMP
recipe), and the ratios compare each precision with its own peers and bf16 with fp32.
--onednn-kernels counts, for each contestant, the oneDNN primitives one training step executes
(ONEDNN_VERBOSE=1; the executions of a 2-step run less those of a 1-step run, one replica) by
kind and implementation, e.g. "convolution brg:avx512_core_bf16".
Contestants whose program is missing are left out, saying so. dptrain-V-system-allocator
(dptrain with --cpu-allocator system, which binaries that link tcmalloc run by default) and
dptrain-V-channels-last (--memory-format channels-last, --recipe fast's layout, where the default
is contiguous: a CPU without AVX-512) and dptrain-V-fast-step (--recipe fast's step: channels-last
and --conv-bias-grad fused) run only when --only names them.

Every round runs each contestant once, in an order rotated from round to round; round 0 warms
caches (and Inductor's) and is not counted. Each run trains --warmup steps, then --steps steps
on the clock: the peer times those itself, dptrain's are read from its progress lines. Peak
memory is the largest total resident set of the run's processes (every process of a peer with
2 replicas: its launcher and its two workers), sampled every 20 ms from /proc. The report gives
medians, their ranges, the CPU model and the ratios, in bench/results/<date>-cpu-peers.{md,json}.

    /usr/bin/python3 bench/run_bench.py --threads 2 --steps 30 --repeats 5

Debian's python3-torch is the same LibTorch 1.13 that Debian's libtorch-dev builds dptrain on.
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
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROGRESS_LINE = re.compile(r"step (\d+)/\d+: .*, ([0-9.]+) img/s, ", re.M)


def cpuinfo_field(name):
    """The first value of `name` in /proc/cpuinfo ("" when unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_model():
    return cpuinfo_field("model name") or platform.processor()


def cpu_flags():
    return set(cpuinfo_field("flags").split())


# ---- Peak memory of a process tree ----------------------------------------------------------

def tree_pids(root):
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
        except OSError:
            pass  # the process ended between the listing and the read
    return pids


def resident_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_measured(command, env=None):
    """Runs `command`; returns (stdout, stderr, peak resident bytes of its process tree)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], sum(resident_bytes(p) for p in tree_pids(process.pid)))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = process.communicate()
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited with {process.returncode}:\n"
                           f"{stderr[-2000:]}")
    return stdout, stderr, peak[0]


# ---- The contestants --------------------------------------------------------------------------

def dptrain_rate(stderr, warmup, steps, batch_size):
    """Images/s over steps warmup+1 .. warmup+steps, from the cumulative rates printed."""
    rates = {int(step): float(rate) for step, rate in PROGRESS_LINE.findall(stderr)}
    end = warmup + steps
    if end not in rates or (warmup > 0 and warmup not in rates):
        raise RuntimeError(f"dptrain printed no progress line for step {warmup} or {end}")
    seconds = end * batch_size / rates[end] - (warmup * batch_size / rates[warmup] if warmup else 0)
    return steps * batch_size / seconds


def dptrain_command(binary, args, replicas, warmup, steps, extra):
    total = warmup + steps
    return [binary, "train", "--devices", ",".join(["cpu"] * replicas),
            "--width", str(args.width), "--batch-size", str(args.batch_size),
            "--lr", "0.1", "--epochs", "1", "--max-steps", str(total),
            "--train-limit", str(total * args.batch_size), "--test-limit", "256",
            "--threads", str(args.threads), "--log-every", str(max(warmup, 1)),
            "--data-dir", args.data_dir] + list(extra)


def dptrain_contestant(name, binary, version, extra=()):
    def run(args, replicas):
        command = dptrain_command(binary, args, replicas, args.warmup, args.steps, extra)
        _, stderr, peak = run_measured(command)
        return dptrain_rate(stderr, args.warmup, args.steps, args.batch_size), peak

    def steps_command(args, steps):
        return dptrain_command(binary, args, 1, 0, steps, extra)
    return {"name": name, "system": "dptrain", "torch": version, "program": binary,
            "flags": list(extra), "run": run, "steps_command": steps_command}


def peer_command(python, args, replicas, warmup, steps, flags):
    return [python, os.path.join(HERE, "pytorch_peer.py"), "--width", str(args.width),
            "--batch-size", str(args.batch_size), "--steps", str(steps),
            "--warmup", str(warmup), "--replicas", str(replicas),
            "--threads", str(args.threads), "--data-dir", args.data_dir] + flags


def peer_contestant(name, python, version, flags):
    def run(args, replicas):
        command = peer_command(python, args, replicas, args.warmup, args.steps, flags)
        stdout, _, peak = run_measured(command)
        return json.loads(stdout.strip().splitlines()[-1])["images_per_second"], peak

    def steps_command(args, steps):
        return peer_command(python, args, 1, 0, steps, flags)
    return {"name": name, "system": "peer", "torch": version, "program": python,
            "flags": flags, "run": run, "steps_command": steps_command}


# ---- Which oneDNN kernels a step runs ----------------------------------------------------------

def onednn_exec_lines(command):
    """Runs `command` with ONEDNN_VERBOSE=1 and returns the fields of each "exec" line it
    printed, from "exec" on: exec,cpu,KIND,IMPL,... (oneDNN 2.x starts the line there; 3.x adds
    fields before "exec", so the fields are found from it). The last field is the milliseconds."""
    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
    stdout, _, _ = run_measured(command, env=env)
    lines = []
    for line in stdout.splitlines():
        fields = line.split(",")
        if line.startswith(("onednn_verbose,", "dnnl_verbose,")) and "exec" in fields:
            lines.append(fields[fields.index("exec"):])
    return lines


def onednn_executions(command):
    """(kind, implementation) -> count of the oneDNN primitives `command` executed."""
    counts = {}
    for fields in onednn_exec_lines(command):
        if len(fields) > 3:
            key = f"{fields[2]} {fields[3]}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def onednn_kernels_per_step(contestant, args):
    """The primitives one training step executes: a 2-step run's less a 1-step run's, so that
    start-up, warm-up and the final evaluation cancel."""
    one = onednn_executions(contestant["steps_command"](args, 1))
    two = onednn_executions(contestant["steps_command"](args, 2))
    step = {k: two.get(k, 0) - one.get(k, 0) for k in set(one) | set(two)}
    return {k: v for k, v in sorted(step.items(), key=lambda kv: (-kv[1], kv[0])) if v}


def torch_version(python):
    result = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                            capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


# Contestants that run only when --only names them.
ONLY_WHEN_NAMED = ("-system-allocator", "-channels-last", "-fast-step")


def contestants(args):
    chosen, missing = [], []
    precisions = args.precisions.split(",")
    bf16_suffixes = [("", [])] * ("fp32" in precisions) + \
        [("-bf16", ["--amp", "bf16"])] * ("bf16" in precisions)
    for name, binary in (("dptrain-1.13", args.dptrain), ("dptrain-2.11", args.dptrain_211)):
        if os.access(binary, os.X_OK):
            for suffix, amp in bf16_suffixes:
                chosen.append(dptrain_contestant(name + suffix, binary, name.split("-")[1], amp))
            # LibTorch's own allocator instead of dptrain's caching one; the same as the default
            # for a binary that links tcmalloc (bench/results/2026-12-04-cpu-allocators.md)
            chosen.append(dptrain_contestant(name + "-system-allocator", binary,
                                             name.split("-")[1], ["--cpu-allocator", "system"]))
            # channels-last where the default is contiguous (an AVX2 CPU): --recipe fast's layout
            chosen.append(dptrain_contestant(name + "-channels-last", binary, name.split("-")[1],
                                             ["--memory-format", "channels-last"]))
            # --recipe fast's step: its layout and its fused conv bias gradients
            chosen.append(dptrain_contestant(name + "-fast-step", binary, name.split("-")[1],
                                             ["--memory-format", "channels-last",
                                              "--conv-bias-grad", "fused"]))
        else:
            missing.append(f"{name} ({binary} is not built)")
    tuned = ["--channels-last", "--inplace"]
    for label, python in (("1.13", args.python_113), ("2.11", args.python_211)):
        version = torch_version(python) if os.access(python, os.X_OK) else None
        if version is None:
            missing.append(f"peer-{label}-* ({python} has no torch)")
            continue
        for suffix, amp in bf16_suffixes:
            chosen.append(peer_contestant(f"peer-{label}-book{suffix}", python, version, amp))
            chosen.append(peer_contestant(f"peer-{label}-tuned{suffix}", python, version,
                                          tuned + amp))
            if label == "2.11":
                chosen.append(peer_contestant(f"peer-2.11-compiled{suffix}", python, version,
                                              tuned + ["--compile"] + amp))
    wanted = set(args.only.split(",")) if args.only else None
    chosen = [c for c in chosen if (c["name"] in wanted if wanted else
                                    not c["name"].endswith(ONLY_WHEN_NAMED))]
    return chosen, missing


# ---- The report -------------------------------------------------------------------------------

def summarize(runs):
    rates = [r["images_per_second"] for r in runs]
    peaks = [r["peak_resident_bytes"] for r in runs]
    return {"images_per_second": statistics.median(rates), "min": min(rates), "max": max(rates),
            "peak_resident_mib": statistics.median(peaks) / 2**20,
            "sec_per_epoch": 60000 / statistics.median(rates), "runs": runs}


def is_bf16(name):
    return name.endswith("-bf16")


def ratios(results, replicas):
    """dptrain on each LibTorch and precision against its book peer, the best peer of its
    precision (fp32: tuned or compiled; bf16: book, tuned or compiled, the issue's target) and
    their memory, and bf16 against fp32; None where a contestant is missing."""
    row = results.get(str(replicas), {})
    out = {}
    for name, result in row.items():
        if not name.startswith("dptrain-") or name.endswith("-system-allocator"):
            continue
        version, bf16 = name.split("-")[1], is_bf16(name)
        suffix = "-bf16" if bf16 else ""
        peers = {n: r for n, r in row.items() if n.startswith("peer-") and is_bf16(n) == bf16}
        best = max((n for n in peers if bf16 or not n.endswith("-book")),
                   key=lambda n: peers[n]["images_per_second"], default=None)
        book = row.get(f"peer-{version}-book{suffix}")
        fp32 = row.get(f"dptrain-{version}") if bf16 else None
        rate = result["images_per_second"]
        out[name] = {
            "vs_book_peer": rate / book["images_per_second"] if book else None,
            "best_tuned_peer": best,
            "vs_best_tuned_peer": rate / peers[best]["images_per_second"] if best else None,
            "memory_vs_best_peer": (result["peak_resident_mib"] / peers[best]["peak_resident_mib"]
                                    if best else None),
            "memory_vs_book_peer": (result["peak_resident_mib"] / book["peak_resident_mib"]
                                    if book else None),
            "vs_fp32": rate / fp32["images_per_second"] if fp32 else None,
            "vs_system_allocator": (rate / row[name + "-system-allocator"]["images_per_second"]
                                    if name + "-system-allocator" in row else None),
            "memory_vs_lightest_peer_same_torch": min(
                (result["peak_resident_mib"] / p["peak_resident_mib"]
                 for n, p in peers.items() if n.startswith(f"peer-{version}-")), default=None),
        }
    return out


def write_report(record, base):
    with open(base + ".json", "w") as f:
        json.dump(record, f, indent=2)
    s = record["settings"]
    lines = [f"# dptrain against the PyTorch peers, CPU, {record['date']}", "",
             f"Machine: {record['machine']['cpu']}, {record['machine']['cores']} cores, "
             f"flags: {', '.join(record['machine']['flags']) or 'none of note'}. "
             f"Width {s['width']}, "
             f"global batch {s['batch_size']}, {s['threads']} threads, {s['warmup']} warm-up "
             f"steps then {s['steps']} timed steps a run; medians of {s['repeats']} alternating "
             f"rounds after one warm-up round. Peak memory: the largest total resident set of "
             f"the run's processes.", ""]
    if record["missing"]:
        lines += ["Left out: " + "; ".join(record["missing"]) + ".", ""]
    for replicas, row in record["results"].items():
        lines += [f"## {replicas} replica(s)", "",
                  "| contestant | PyTorch | img/s (median) | range | sec/epoch | peak memory MiB |",
                  "|---|---|---|---|---|---|"]
        for name, r in sorted(row.items(), key=lambda kv: -kv[1]["images_per_second"]):
            lines.append(f"| {name} | {r['torch']} | {r['images_per_second']:.1f} | "
                         f"{r['min']:.0f}–{r['max']:.0f} | {r['sec_per_epoch']:.0f} | "
                         f"{r['peak_resident_mib']:.0f} |")
        lines.append("")
        for name, q in record["ratios"][replicas].items():
            parts = []
            if q["vs_book_peer"] is not None:
                parts.append(f"{q['vs_book_peer']:.2f}× the book's peer on the same PyTorch")
            if q["vs_best_tuned_peer"] is not None:
                kind = "peer in bf16" if is_bf16(name) else "tuned or compiled peer"
                parts.append(f"{q['vs_best_tuned_peer']:.2f}× the fastest {kind} "
                             f"({q['best_tuned_peer']}), with {q['memory_vs_best_peer']:.2f}× "
                             f"its memory")
            if q["vs_fp32"] is not None:
                parts.append(f"{q['vs_fp32']:.2f}× itself in fp32")
            if q["vs_system_allocator"] is not None:
                parts.append(f"{q['vs_system_allocator']:.2f}× itself with LibTorch's allocator")
            if q["memory_vs_lightest_peer_same_torch"] is not None:
                parts.append(f"{q['memory_vs_lightest_peer_same_torch']:.2f}× the memory of the "
                             f"lightest peer on the same PyTorch")
            lines.append(f"- {name}: " + "; ".join(parts) + ".")
        lines.append("")
    if record.get("onednn_kernels"):
        lines += ["## oneDNN primitives executed by one training step (one replica)", "",
                  "From `ONEDNN_VERBOSE=1`: a 2-step run's executions less a 1-step run's.", ""]
        for name, kernels in record["onednn_kernels"].items():
            listed = ", ".join(f"{k} ×{v}" for k, v in kernels.items()) or "none"
            lines.append(f"- {name}: {sum(kernels.values())} executions: {listed}")
        lines.append("")
    lines.append(f"Command: `{record['command']}`")
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description="dptrain against the PyTorch peers, on CPU")
    parser.add_argument("--dptrain", default=os.path.join(ROOT, "build", "app", "dptrain"))
    parser.add_argument("--dptrain-211", default=os.path.join(ROOT, "build-211", "app", "dptrain"))
    parser.add_argument("--python-113", default="/usr/bin/python3")
    parser.add_argument("--python-211", default=os.path.join(ROOT, ".venv-torch", "bin", "python"))
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--replicas", default="1,2", help="comma list of replica counts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="",
                        help="comma list of contestant names (default: all but the "
                             "dptrain-*-system-allocator ones)")
    parser.add_argument("--precisions", default="fp32",
                        help="comma list of fp32 and bf16 (bf16: dptrain --amp bf16, the peers "
                             "under bf16 autocast)")
    parser.add_argument("--onednn-kernels", action="store_true",
                        help="also count the oneDNN primitives one step of each contestant runs")
    parser.add_argument("--name", default="cpu-peers",
                        help="the results' file name, after the date")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (dptrain's rate is read from its progress)")

    if not args.precisions or set(args.precisions.split(",")) - {"fp32", "bf16"}:
        parser.error("--precisions takes fp32, bf16 or both, comma-separated")

    chosen, missing = contestants(args)
    for note in missing:
        print(f"left out: {note}", flush=True)
    results = {}
    for replicas in [int(r) for r in args.replicas.split(",")]:
        runs = {c["name"]: [] for c in chosen}
        for round_index in range(args.repeats + 1):  # round 0 warms caches, not counted
            shift = round_index % len(chosen)
            for c in chosen[shift:] + chosen[:shift]:
                started = time.perf_counter()
                rate, peak = c["run"](args, replicas)
                print(f"replicas {replicas} round {round_index} {c['name']}: {rate:.1f} img/s, "
                      f"peak {peak / 2**20:.0f} MiB ({time.perf_counter() - started:.0f} s)",
                      flush=True)
                if round_index > 0:
                    runs[c["name"]].append({"images_per_second": rate,
                                            "peak_resident_bytes": peak})
        results[str(replicas)] = {}
        for c in chosen:
            summary = summarize(runs[c["name"]])
            summary.update(torch=c["torch"], program=c["program"], flags=c.get("flags", []))
            results[str(replicas)][c["name"]] = summary

    kernels = {}
    if args.onednn_kernels:
        for c in chosen:
            kernels[c["name"]] = onednn_kernels_per_step(c, args)
            print(f"oneDNN kernels of one step, {c['name']}: {kernels[c['name']]}", flush=True)

    record = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "avx512": "avx512f" in cpu_flags(),
                    "flags": sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_tile",
                                                   "amx_bf16", "avx512_fp16"}),
                    "host": platform.node()},
        "command": shlex.join([sys.executable] + sys.argv),
        "settings": {"width": args.width, "batch_size": args.batch_size, "warmup": args.warmup,
                     "steps": args.steps, "threads": args.threads, "repeats": args.repeats,
                     "precisions": args.precisions.split(",")},
        "onednn_kernels": kernels,
        "missing": missing,
        "results": results,
        "ratios": {r: ratios(results, int(r)) for r in results},
    }
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    print(write_report(record, os.path.join(args.out, f"{stamp}-{args.name}")))


if __name__ == "__main__":
    main()
