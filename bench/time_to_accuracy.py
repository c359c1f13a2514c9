#!/usr/bin/env python3
"""Time to accuracy (issue 54): dptrain and its PyTorch peer (bench/recipe_peer.py) train the
same recipe on the same CPU, alternating (dptrain seed s, peer seed s, then the next seed), and
for each run this reads its per-epoch figures (dptrain's --metrics JSONL, the peer's JSON lines)
and gives the wall time from the first step to the end of the first epoch whose test accuracy
reaches --target: the sum of the training and evaluation seconds of the epochs up to it (the
evaluation's share also given apart), or "not reached"; and the final test and validation
accuracy. Medians over the seeds (a seed that never reaches counts as infinitely slow), the
ratio peer/dptrain, the CPU model and its flags, and the exact commands go into
<out>/<date>-<name>.{json,md}.
Not here: the measuring helpers (bench/run_bench.py's, reused), the recipe's flags (one table,
bench/recipe_flags.py), choosing the recipe (the --val-split search).

    /usr/bin/python3 bench/time_to_accuracy.py --tiny            # seconds: the plumbing only
    /usr/bin/python3 bench/time_to_accuracy.py --dptrain build/app/dptrain --threads 2 \
        --width 16 --epochs 10 --target 0.93 --momentum 0.9 --nesterov ... --seeds 0,1,2

dptrain runs in --layout, by default channels-last as `--recipe fast` asks where the CPU has AVX2
(else contiguous), and with --conv-bias-grad, by default fused as `--recipe fast` asks. The peer runs tuned (--peer-flags, default the in-place ReLUs, and
channels-last exactly where dptrain runs it; --peer-flags "... --compile" with a torch 2.x
--python), with the same --amp. The peer's --val-split holds out as many images as dptrain's,
but not the same ones.
"""
import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from recipe_flags import add_recipe_flags, recipe_argv  # noqa: E402
from run_bench import cpu_flags, cpu_model, run_measured  # noqa: E402

NOTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
# The full measurement's settings, and --tiny's: a few hundred images, a narrow model, a low
# target, so that the whole comparison runs in seconds and checks only the plumbing.
FULL = {"width": 16, "batch_size": 256, "epochs": 10, "target": 0.93, "train_limit": None,
        "test_limit": None, "seeds": "0,1,2"}
TINY = {"width": 4, "batch_size": 64, "epochs": 2, "target": 0.5, "train_limit": 512,
        "test_limit": 256, "seeds": "0"}
SYSTEMS = ("dptrain", "peer")


# ---- One run's figures -------------------------------------------------------------------------

def time_to_target(epochs, target):
    """From the epochs' figures (in order), the first epoch whose test accuracy reaches `target`
    and the seconds up to its end: training plus evaluation, and the evaluation apart."""
    train_seconds, eval_seconds = 0.0, 0.0
    for e in epochs:
        train_seconds += e["seconds"]
        eval_seconds += e.get("eval_seconds") or 0.0
        if e["test_acc"] is not None and e["test_acc"] >= target:
            return {"reached": True, "epoch": e["epoch"],
                    "seconds": train_seconds + eval_seconds, "eval_seconds": eval_seconds}
    return {"reached": False, "epoch": None, "seconds": None, "eval_seconds": None}


def run_summary(epochs, target):
    last = epochs[-1]
    return dict(time_to_target(epochs, target), final_test_acc=last["test_acc"],
                final_val_acc=last.get("val_acc"),
                total_seconds=sum(e["seconds"] + (e.get("eval_seconds") or 0.0) for e in epochs),
                eval_seconds_missing=any("eval_seconds" not in e for e in epochs),
                epochs=[{k: e.get(k) for k in ("epoch", "seconds", "eval_seconds", "test_acc",
                                               "val_acc")} for e in epochs])


def read_jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# ---- The two programs --------------------------------------------------------------------------

def common_argv(args, seed):
    argv = ["--width", str(args.width), "--batch-size", str(args.batch_size), "--lr",
            str(args.lr), "--epochs", str(args.epochs), "--seed", str(seed), "--threads",
            str(args.threads), "--data-dir", args.data_dir, "--amp", args.amp]
    for flag, value in (("--train-limit", args.train_limit), ("--test-limit", args.test_limit)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + recipe_argv(args)


def dptrain_command(args, seed, metrics):
    return ([args.dptrain, "train", "--devices", "cpu", "--quiet", "--metrics", metrics] +
            common_argv(args, seed) + ["--memory-format", args.layout] +
            ["--conv-bias-grad", args.conv_bias_grad] +
            shlex.split(args.dptrain_flags))


def peer_command(args, seed):
    return ([args.python, args.peer_script] + common_argv(args, seed) +
            shlex.split(args.peer_flags))


def run_one(system, args, seed, scratch):
    """(command, the epochs' figures, peak resident bytes) of one run."""
    if system == "dptrain":
        metrics = os.path.join(scratch, f"dptrain-seed{seed}.jsonl")
        command = dptrain_command(args, seed, metrics)
        _, _, peak = run_measured(command)
        with open(metrics) as f:
            epochs = read_jsonl(f.read())
    else:
        command = peer_command(args, seed)
        stdout, _, peak = run_measured(command)
        epochs = [e for e in read_jsonl(stdout) if "epoch" in e]
    if len(epochs) != args.epochs:
        raise RuntimeError(f"{system} seed {seed} gave {len(epochs)} epochs' figures, not "
                           f"{args.epochs}: {shlex.join(command)}")
    return command, epochs, peak


# ---- Medians and the report --------------------------------------------------------------------

def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def system_summary(runs):
    """Medians over the seeds; a seed that did not reach the target counts as infinite time."""
    times = [r["seconds"] if r["reached"] else math.inf for r in runs]
    median_time = statistics.median(times)
    return {"reached": sum(r["reached"] for r in runs), "seeds": len(runs),
            "median_seconds": None if math.isinf(median_time) else median_time,
            "median_eval_seconds": median_or_none([r["eval_seconds"] for r in runs]),
            "median_epoch": median_or_none([r["epoch"] for r in runs]),
            "median_final_test_acc": median_or_none([r["final_test_acc"] for r in runs]),
            "median_final_val_acc": median_or_none([r["final_val_acc"] for r in runs]),
            "median_total_seconds": median_or_none([r["total_seconds"] for r in runs])}


def figure(value, form="{:.1f}"):
    return "—" if value is None else form.format(value)


def write_report(record, base):
    with open(base + ".json", "w") as f:
        json.dump(record, f, indent=2)
    s, m = record["settings"], record["machine"]
    lines = [f"# Time to test accuracy {s['target']}: dptrain and the PyTorch peer, CPU, "
             f"{record['date']}", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, flags: "
             f"{', '.join(m['flags']) or 'none of these'} (of {', '.join(NOTED_FLAGS)}). "
             f"Width {s['width']}, batch {s['batch_size']}, {s['epochs']} epochs, lr {s['lr']}, "
             f"{s['threads']} threads, amp {s['amp']}, dptrain's layout {s['layout']} and "
             f"conv bias gradients {s.get('conv_bias_grad', 'library')}, the "
             f"peer's flags `{s['peer_flags']}`; recipe: "
             f"`{' '.join(s['recipe']) or 'the book (no recipe flags)'}`. Runs alternate, "
             f"dptrain then the peer for each seed. Time: from the first step to the end of "
             f"the first epoch at or above the target, training and evaluation (eval apart). "
             f"The peer's validation images are as many as dptrain's, not the same ones.", "",
             "| system | seed | time to target (s) | of which eval (s) | epoch | final test acc "
             "| final val acc | all epochs (s) |", "|---|---|---|---|---|---|---|---|"]
    for system in SYSTEMS:
        for r in record["runs"][system]:
            reached = r["reached"]
            lines.append(f"| {system} | {r['seed']} | "
                         f"{figure(r['seconds']) if reached else 'not reached'} | "
                         f"{figure(r['eval_seconds'])} | {figure(r['epoch'], '{}')} | "
                         f"{figure(r['final_test_acc'], '{:.4f}')} | "
                         f"{figure(r['final_val_acc'], '{:.4f}')} | "
                         f"{figure(r['total_seconds'])} |")
    for system in SYSTEMS:
        q = record["summary"][system]
        lines.append(f"| **{system} median** | {q['reached']}/{q['seeds']} reached | "
                     f"{figure(q['median_seconds']) if q['median_seconds'] else 'not reached'} | "
                     f"{figure(q['median_eval_seconds'])} | {figure(q['median_epoch'], '{}')} | "
                     f"{figure(q['median_final_test_acc'], '{:.4f}')} | "
                     f"{figure(q['median_final_val_acc'], '{:.4f}')} | "
                     f"{figure(q['median_total_seconds'])} |")
    ratio = record["summary"]["peer_over_dptrain"]
    lines += ["", f"Median time to target, peer / dptrain: "
              f"{figure(ratio, '{:.2f}×') if ratio else 'not comparable (a median not reached)'}."]
    if record["notes"]:
        lines += [""] + [f"- {note}" for note in record["notes"]]
    lines += ["", "Commands (seed 0 shown; each seed its own):", "",
              f"- dptrain: `{record['commands']['dptrain']}`",
              f"- peer: `{record['commands']['peer']}`", "", f"Command: `{record['command']}`"]
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def measure(args, seeds, scratch):
    runs = {system: [] for system in SYSTEMS}
    commands = {}
    for seed in seeds:
        for system in SYSTEMS:
            command, epochs, peak = run_one(system, args, seed, scratch)
            commands.setdefault(system, shlex.join(command))
            summary = dict(run_summary(epochs, args.target), seed=seed,
                           peak_resident_mib=peak / 2**20)
            runs[system].append(summary)
            print(f"{system} seed {seed}: "
                  f"{figure(summary['seconds']) + ' s' if summary['reached'] else 'not reached'}"
                  f" to {args.target}, final test acc {summary['final_test_acc']:.4f}",
                  flush=True)
    return runs, commands


def settings_with_defaults(args):
    preset = TINY if args.tiny else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    flags = cpu_flags()
    if args.layout is None:  # as --recipe fast, which dptrain refuses below AVX2
        args.layout = "channels-last" if "avx2" in flags else "contiguous"
    if args.peer_flags is None:
        # The peer in dptrain's layout (auto: channels-last where the CPU has AVX-512). In
        # channels-last on AVX2 kernels the peer runs oneDNN's strided 1x1 convolution, whose
        # backward dptrain avoids (docs/channels-last.md); at width 16 it has not failed there.
        channels_last = args.layout == "channels-last" or (args.layout == "auto" and
                                                           "avx512f" in flags)
        args.peer_flags = "--inplace" + (" --channels-last" if channels_last else "")


def parser():
    p = argparse.ArgumentParser(description="time to a target test accuracy: dptrain and the "
                                "PyTorch peer with the same recipe, alternating, on CPU")
    p.add_argument("--dptrain", default=os.path.join(ROOT, "build", "app", "dptrain"))
    p.add_argument("--python", default="/usr/bin/python3", help="the peer's Python (with torch)")
    p.add_argument("--peer-script", default=os.path.join(HERE, "recipe_peer.py"))
    p.add_argument("--peer-flags", default=None,
                   help="the peer's own tuning flags (default: the tuned peer's, --inplace, and "
                        "--channels-last where dptrain runs channels-last)")
    p.add_argument("--layout", choices=["auto", "channels-last", "contiguous"], default=None,
                   help="dptrain's --memory-format (default: channels-last, as --recipe fast, "
                        "where the CPU has AVX2, else contiguous)")
    p.add_argument("--conv-bias-grad", choices=["library", "fused"], default="fused",
                   help="dptrain's --conv-bias-grad (default: fused, as --recipe fast)")
    p.add_argument("--dptrain-flags", default="", help="dptrain's own extra flags")
    p.add_argument("--data-dir", default=os.environ.get("DPTRAIN_DATA") or
                   "/usr/share/datasets/fashion-mnist")
    p.add_argument("--tiny", action="store_true",
                   help="a check of the plumbing in seconds: " + json.dumps(TINY))
    for key in ("width", "batch_size", "epochs", "train_limit", "test_limit"):
        p.add_argument("--" + key.replace("_", "-"), type=int, default=None,
                       help=f"(default {FULL[key]}; --tiny: {TINY[key]})")
    p.add_argument("--target", type=float, default=None,
                   help=f"test accuracy to reach (default {FULL['target']})")
    p.add_argument("--seeds", default=None, help="comma list, at least 3 (default 0,1,2)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--amp", choices=["off", "bf16"], default="off")
    p.add_argument("--name", default=None,
                   help="the results' file name after the date (default: cpu-time-to-accuracy, "
                        "--tiny: tta-tiny)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    add_recipe_flags(p)
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    settings_with_defaults(args)
    seeds = [int(s) for s in args.seeds.split(",")]
    if len(seeds) < 3 and not args.tiny:
        p.error("--seeds: at least 3 seeds for medians (issue 54); --tiny allows fewer")
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    name = args.name or ("tta-tiny" if args.tiny else "cpu-time-to-accuracy")
    base = os.path.join(args.out, f"{stamp}-{name}")
    with tempfile.TemporaryDirectory() as scratch:  # dptrain's metrics files, read into the record
        runs, commands = measure(args, seeds, scratch)
    summary = {system: system_summary(runs[system]) for system in SYSTEMS}
    d, q = summary["dptrain"]["median_seconds"], summary["peer"]["median_seconds"]
    summary["peer_over_dptrain"] = q / d if d and q else None
    notes = []
    if any(r["eval_seconds_missing"] for r in runs["dptrain"]):
        notes.append("dptrain's metrics had no eval_seconds (a binary before issue 54's): its "
                     "times are training only, the evaluation not counted.")
    record = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "flags": sorted(cpu_flags() & set(NOTED_FLAGS)), "host": platform.node()},
        "command": shlex.join([sys.executable] + sys.argv),
        "commands": commands,
        "settings": {"width": args.width, "batch_size": args.batch_size, "epochs": args.epochs,
                     "lr": args.lr, "threads": args.threads, "amp": args.amp,
                     "target": args.target, "train_limit": args.train_limit,
                     "test_limit": args.test_limit, "seeds": seeds,
                     "recipe": recipe_argv(args), "layout": args.layout,
                     "conv_bias_grad": args.conv_bias_grad,
                     "peer_flags": args.peer_flags,
                     "dptrain_flags": args.dptrain_flags},
        "runs": runs, "summary": summary, "notes": notes,
    }
    print(write_report(record, base))
    return record


if __name__ == "__main__":
    main()
