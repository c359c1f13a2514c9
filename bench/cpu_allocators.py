#!/usr/bin/env python3
"""dptrain's caching CPU allocator against the allocators the field uses, on the same steps.

The contestants all run one dptrain binary with the same width, global batch and threads:
  caching          --cpu-allocator caching (dptrain's own, core/cpu_allocator.cpp until a42204b)
  glibc            --cpu-allocator system: LibTorch's posix_memalign/free, glibc 2.36 as it ships
  glibc-tuned      the same with glibc's tunables M_MMAP_THRESHOLD and M_TRIM_THRESHOLD raised
                   (GLIBC_TUNABLES), which keep freed activations in the heap instead of
                   returning them to the kernel and faulting them in again
  jemalloc         --cpu-allocator system under LD_PRELOAD=libjemalloc.so.2 (PyTorch's CPU
                   tuning guide)
  jemalloc-tuned   the same with the guide's MALLOC_CONF
  tcmalloc         --cpu-allocator system under LD_PRELOAD=libtcmalloc_minimal.so.4 (the guide)
  mimalloc         --cpu-allocator system under LD_PRELOAD=libmimalloc.so.2 (PyTorch's default
                   on AArch64 since 2.10)
Contestants whose library is not installed are left out, saying so (Debian 12:
apt-get install libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0).

Every round runs each (contestant, replica count) pair once, in an order rotated from round to
round, so that the load of a shared machine falls on all of them alike; one run before the
rounds warms the file cache and is not counted. Each run trains --warmup steps, then --steps
steps on the clock, timed here between the arrivals of dptrain's progress lines for those two
steps. Minor page faults and user and system CPU seconds per step are the process's own
(/proc/PID/stat, all threads) over the same timed steps: on a loaded machine the CPU seconds, and
the system seconds above all, say what the allocator costs more steadily than images/s do; peak RSS is the process's ru_maxrss from wait4 (2 replicas are threads of one
process). The report gives medians and ranges, and writes
bench/results/<date>-cpu-allocators.{md,json}. A contestant matches caching when its images/s
are within the noise (median within 3% or ranges overlapping) and it spends at most 0.01 s a step
more in the kernel.

The dptrain binary links tcmalloc and keeps no caching allocator of its own, as this bench showed
(Note [CPU memory: tcmalloc, not a cache of our own] in lib/include/dptrain/core/cpu_allocator.h),
so the bench runs a dptrain built with that allocator (a42204b):

    /usr/bin/python3 bench/cpu_allocators.py --dptrain /tmp/bins/dptrain-a42204b \
        --width 16 --warmup 2 --steps 4 --repeats 4
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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from run_bench import cpu_flags, cpu_model  # noqa: E402  (the same CPU naming as run_bench)

LIBDIR = "/usr/lib/x86_64-linux-gnu"
PROGRESS_STEP = re.compile(r"step (\d+)/\d+: ")
# glibc's largest mmap threshold on 64-bit (4 MiB * sizeof(long)): every activation of the
# runs here (at most 13 MB) then comes from the heap, and a trim threshold of 1 GiB keeps the
# heap's top from being given back after each step.
GLIBC_TUNED = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
# PyTorch's CPU performance tuning guide, "Switch Memory allocator".
JEMALLOC_GUIDE_CONF = ("oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                       "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000")


def contestants():
    """(name, what it is, --cpu-allocator, extra environment, library needed or None)."""
    jemalloc = os.path.join(LIBDIR, "libjemalloc.so.2")
    return [
        ("caching", "--cpu-allocator caching (dptrain's)", "caching", {}, None),
        ("glibc", "--cpu-allocator system, glibc's defaults", "system", {}, None),
        ("glibc-tuned", f"system, GLIBC_TUNABLES={GLIBC_TUNED}", "system",
         {"GLIBC_TUNABLES": GLIBC_TUNED}, None),
        ("jemalloc", "system, LD_PRELOAD=libjemalloc.so.2 (5.3)", "system",
         {"LD_PRELOAD": jemalloc}, jemalloc),
        ("jemalloc-tuned", f"system, jemalloc with MALLOC_CONF={JEMALLOC_GUIDE_CONF}", "system",
         {"LD_PRELOAD": jemalloc, "MALLOC_CONF": JEMALLOC_GUIDE_CONF}, jemalloc),
        ("tcmalloc", "system, LD_PRELOAD=libtcmalloc_minimal.so.4 (gperftools 2.10)", "system",
         {"LD_PRELOAD": os.path.join(LIBDIR, "libtcmalloc_minimal.so.4")},
         os.path.join(LIBDIR, "libtcmalloc_minimal.so.4")),
        ("mimalloc", "system, LD_PRELOAD=libmimalloc.so.2 (2.0)", "system",
         {"LD_PRELOAD": os.path.join(LIBDIR, "libmimalloc.so.2")},
         os.path.join(LIBDIR, "libmimalloc.so.2")),
    ]


TICK = os.sysconf("SC_CLK_TCK")


def process_counters(pid):
    """(minor faults, user seconds, system seconds) of the process so far, all its threads
    together: fields 10, 14 and 15 of /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7]), int(fields[11]) / TICK, int(fields[12]) / TICK


def mapped_library(pid, library):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return library in f.read()
    except OSError:
        return False


def run_once(args, allocator, extra_env, library, replicas):
    """One training run: a dict of images/s, minor faults, user and system CPU seconds per
    timed step, and peak RSS."""
    total = args.warmup + args.steps
    command = [args.dptrain, "train", "--devices", ",".join(["cpu"] * replicas),
               "--width", str(args.width), "--batch-size", str(args.batch_size),
               "--lr", "0.1", "--epochs", "1", "--max-steps", str(total),
               "--train-limit", str(total * args.batch_size), "--test-limit", "256",
               "--threads", str(args.threads), "--log-every", str(args.warmup),
               "--data-dir", args.data_dir, "--cpu-allocator", allocator]
    env = dict(os.environ)
    for key in ("LD_PRELOAD", "MALLOC_CONF", "GLIBC_TUNABLES"):
        env.pop(key, None)
    env.update(extra_env)
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               text=True, env=env)
    marks, tail, preloaded = {}, [], library is None
    for line in process.stderr:
        tail = (tail + [line])[-20:]
        found = PROGRESS_STEP.search(line)
        if found and int(found.group(1)) in (args.warmup, total):
            marks[int(found.group(1))] = (time.perf_counter(), process_counters(process.pid))
            preloaded = preloaded or mapped_library(process.pid, library)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0 or len(marks) != 2:
        raise RuntimeError(f"{shlex.join(command)} exited with {process.returncode}:\n"
                           + "".join(tail))
    if not preloaded:
        raise RuntimeError(f"{library} was not mapped into {args.dptrain}: LD_PRELOAD failed")
    (start, before), (end, after) = marks[args.warmup], marks[total]
    per_step = [(a - b) / args.steps for a, b in zip(after, before)]
    return {"images_per_second": args.steps * args.batch_size / (end - start),
            "minor_faults_per_step": per_step[0], "user_seconds_per_step": per_step[1],
            "system_seconds_per_step": per_step[2], "peak_rss_mib": usage.ru_maxrss / 1024}


def summarize(runs):
    def stat(key):
        values = [r[key] for r in runs]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return {key: stat(key) for key in runs[0]} | {"runs": runs}


# What a contestant may spend in the kernel a step beyond caching's and still match it: on a
# loaded machine images/s ranges overlap for nearly everyone, the system seconds do not.
SYSTEM_SECONDS_MARGIN = 0.01


def verdicts(results):
    """Each contestant against caching, by the rule of issue 42: within the noise when its
    median images/s is within 3% of caching's or the two ranges overlap. It matches caching when
    it is also within SYSTEM_SECONDS_MARGIN of caching's system seconds a step (the refaults the
    cache was written to avoid)."""
    out = {}
    for replicas, row in results.items():
        base = row["caching"]
        out[replicas] = {}
        for name, result in row.items():
            if name == "caching":
                continue
            rate = result["images_per_second"]
            ratio = rate["median"] / base["images_per_second"]["median"]
            overlap = (rate["max"] >= base["images_per_second"]["min"]
                       and rate["min"] <= base["images_per_second"]["max"])
            extra_system = (result["system_seconds_per_step"]["median"]
                            - base["system_seconds_per_step"]["median"])
            within = abs(ratio - 1) <= 0.03 or overlap
            out[replicas][name] = {
                "vs_caching": ratio,
                "ranges_overlap": overlap,
                "within_noise": within,
                "extra_system_seconds_per_step": extra_system,
                "matches_caching": within and extra_system <= SYSTEM_SECONDS_MARGIN,
                "rss_vs_caching": (result["peak_rss_mib"]["median"]
                                   / base["peak_rss_mib"]["median"]),
            }
    return out


def write_report(record, base):
    with open(base + ".json", "w") as f:
        json.dump(record, f, indent=2)
    m, s = record["machine"], record["settings"]
    lines = [f"# dptrain's caching CPU allocator against the field, {record['date']}", "",
             f"Machine: {m['cpu']}, {m['cores']} cores (shared with other sessions' builds and "
             f"runs while this ran), AVX-512F: {m['avx512f']}, AVX512-BF16: {m['avx512_bf16']}, "
             f"AMX: {m['amx']}; glibc {m['glibc']}; LibTorch {s['libtorch']} "
             f"(`{s['dptrain']}`). Width {s['width']}, global batch {s['batch_size']}, "
             f"{s['threads']} threads, {s['warmup']} warm-up steps then {s['steps']} timed steps "
             f"a run; medians and ranges of {s['repeats']} rounds, every pair of contestant and "
             f"replica count once a round in a rotated order. Images/s, minor faults per step "
             f"and the process's CPU seconds per step (medians) over the timed steps; peak RSS "
             f"of the whole run (ru_maxrss; 2 replicas are threads of one process). Load "
             f"average (1 min) {m['load_before']} before and {m['load_after']} after.", ""]
    if record["missing"]:
        lines += ["Left out: " + "; ".join(record["missing"]) + ".", ""]
    lines += ["| contestant | how |", "|---|---|"]
    lines += [f"| {name} | {how} |" for name, how in record["contestants"].items()]
    lines.append("")
    for replicas, row in record["results"].items():
        lines += [f"## {replicas} replica(s)", "",
                  "| contestant | img/s (median) | range | vs caching | peak RSS MiB (median) "
                  "| range | minor faults/step (median) | range | user s/step | system s/step |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in sorted(row.items(), key=lambda kv: -kv[1]["images_per_second"]["median"]):
            rate, rss, flt = r["images_per_second"], r["peak_rss_mib"], r["minor_faults_per_step"]
            vs = record["verdicts"][replicas].get(name, {}).get("vs_caching", 1.0)
            lines.append(f"| {name} | {rate['median']:.1f} | {rate['min']:.0f}–{rate['max']:.0f} "
                         f"| {vs:.3f} | {rss['median']:.0f} | {rss['min']:.0f}–{rss['max']:.0f} "
                         f"| {flt['median']:.0f} | {flt['min']:.0f}–{flt['max']:.0f} "
                         f"| {r['user_seconds_per_step']['median']:.2f} "
                         f"| {r['system_seconds_per_step']['median']:.3f} |")
        lines.append("")
        for name, v in record["verdicts"][replicas].items():
            lines.append(f"- {name}: {v['vs_caching']:.3f}× caching's images/s "
                         f"({'within' if v['within_noise'] else 'outside'} the noise: "
                         f"{'ranges overlap' if v['ranges_overlap'] else 'ranges apart'}), "
                         f"{v['extra_system_seconds_per_step']:+.3f} system s/step, "
                         f"{v['rss_vs_caching']:.2f}× its peak RSS: "
                         f"{'matches' if v['matches_caching'] else 'does not match'} caching.")
        lines.append("")
    if record.get("decision"):  # written into the JSON after the run, by whoever decided
        lines += ["## What was decided", "", record["decision"], ""]
    lines.append(f"Command: `{record['command']}`")
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description="dptrain's CPU allocator against the field")
    parser.add_argument("--dptrain",
                        help="a dptrain that has --cpu-allocator caching and links no tcmalloc")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--replicas", default="1,2", help="comma list of replica counts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="", help="comma list of contestant names")
    parser.add_argument("--name", default="cpu-allocators")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--from-json", metavar="FILE",
                        help="write the report again from a run's JSON (no runs)")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            record = json.load(f)
        record["verdicts"] = verdicts(record["results"])
        print(write_report(record, args.from_json[:-len(".json")]))
        return
    if not args.dptrain:
        parser.error("--dptrain is required")
    if args.repeats < 1 or args.warmup < 1:
        parser.error("--repeats and --warmup must be at least 1")
    if "libtcmalloc" in subprocess.run(["ldd", args.dptrain], capture_output=True,
                                       text=True).stdout:
        parser.error(f"{args.dptrain} links tcmalloc, so its 'system' is not glibc's malloc and "
                     f"it has no caching allocator: give a dptrain from before the change this "
                     f"bench decided (a42204b)")
    if args.steps % args.warmup:
        parser.error("--steps must be a multiple of --warmup (dptrain prints a progress line "
                     "every --warmup steps)")

    chosen, missing = [], []
    wanted = set(args.only.split(",")) if args.only else None
    for name, how, allocator, env, library in contestants():
        if wanted and name not in wanted:
            continue
        if library and not os.path.exists(library):
            missing.append(f"{name} ({library} is not installed)")
            continue
        chosen.append((name, how, allocator, env, library))
    for note in missing:
        print(f"left out: {note}", flush=True)
    replica_counts = [int(r) for r in args.replicas.split(",")]
    pairs = [(c, r) for r in replica_counts for c in chosen]
    load_before = os.getloadavg()[0]
    run_once(args, "caching", {}, None, replica_counts[0])  # warms the file cache, not counted
    runs = {(c[0], r): [] for c, r in pairs}
    for round_index in range(args.repeats):
        shift = round_index * len(pairs) // args.repeats  # a different start every round
        for (name, _, allocator, env, library), replicas in pairs[shift:] + pairs[:shift]:
            started = time.perf_counter()
            run = run_once(args, allocator, env, library, replicas)
            print(f"round {round_index} {name} x{replicas}: {run['images_per_second']:.1f} "
                  f"img/s, {run['minor_faults_per_step']:.0f} faults/step, "
                  f"{run['user_seconds_per_step']:.2f} user s/step, "
                  f"{run['system_seconds_per_step']:.2f} system s/step, "
                  f"peak {run['peak_rss_mib']:.0f} MiB ({time.perf_counter() - started:.0f} s)",
                  flush=True)
            runs[(name, replicas)].append(run)
    results = {str(r): {c[0]: summarize(runs[(c[0], r)]) for c in chosen}
               for r in replica_counts}
    flags = cpu_flags()
    libtorch = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libtorch1.13"],
                              capture_output=True, text=True).stdout.strip() or "unknown"
    record = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "avx512f": "yes" if "avx512f" in flags else "no",
                    "avx512_bf16": "yes" if "avx512_bf16" in flags else "no",
                    "amx": "yes" if {"amx_tile", "amx_bf16"} & flags else "no",
                    "glibc": platform.libc_ver()[1], "host": platform.node(),
                    "load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1)},
        "command": shlex.join([sys.executable] + sys.argv),
        "settings": {"dptrain": args.dptrain, "libtorch": libtorch, "width": args.width,
                     "batch_size": args.batch_size, "warmup": args.warmup, "steps": args.steps,
                     "threads": args.threads, "repeats": args.repeats},
        "contestants": {c[0]: c[1] for c in chosen},
        "missing": missing,
        "results": results,
        "verdicts": None,
    }
    record["verdicts"] = verdicts(results)
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    print(write_report(record, os.path.join(args.out, f"{stamp}-{args.name}")))


if __name__ == "__main__":
    main()
