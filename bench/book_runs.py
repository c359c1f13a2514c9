#!/usr/bin/env python3
"""The book's two runs scaled to this CPU, dptrain beside the book's PyTorch code (book_peer.py),
10 epochs on the full 60,000/10,000 images, several seeds: does dptrain learn as the book does?

  run      trains every job not yet on disk, one after another, each writing its per-epoch
           records to bench/results/book-runs/<job>.jsonl (and its command to <job>.cmd);
  report   reads them and writes bench/results/<date>-cpu-book-runs.{md,json,svg}.

The runs (the book's, with two GPUs turned into two CPU replicas):
  one          one replica, batch 256, lr 0.1;
  two          two replicas, batch 512, lr 0.2, each normalising its own half-batch;
  two-sync-bn  the same with BatchNorm statistics over the whole batch (dptrain --sync-bn;
               the peer's --global-batch-norm).

    /usr/bin/python3 bench/book_runs.py run --seeds 0,1
    /usr/bin/python3 bench/book_runs.py report
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RAW = os.path.join(HERE, "results", "book-runs")

# name: (global batch, lr, replicas, dptrain's extra flags, the peer's extra flags)
RUNS = {
    "one": (256, 0.1, 1, [], []),
    "two": (512, 0.2, 2, [], ["--replicas", "2"]),
    "two-sync-bn": (512, 0.2, 2, ["--sync-bn"], ["--replicas", "2", "--global-batch-norm"]),
}
SYSTEMS = ("dptrain", "peer")


def job_name(system, run, width, seed, threads, epochs):
    return f"{system}-{run}-width{width}-seed{seed}-threads{threads}-epochs{epochs}"


def job_command(args, system, run, seed, threads, epochs, metrics):
    batch, lr, replicas, dptrain_flags, peer_flags = RUNS[run]
    common = ["--width", str(args.width), "--batch-size", str(batch), "--lr", str(lr),
              "--epochs", str(epochs), "--seed", str(seed), "--threads", str(threads),
              "--data-dir", args.data_dir]
    if system == "dptrain":
        devices = ",".join(["cpu"] * replicas)
        return ([args.dptrain, "train", "--devices", devices, "--quiet", "--metrics", metrics]
                + common + dptrain_flags)
    return [args.python, os.path.join(HERE, "book_peer.py")] + common + peer_flags


def run_job(args, system, run, seed, threads, epochs):
    name = job_name(system, run, args.width, seed, threads, epochs)
    out = os.path.join(RAW, name + ".jsonl")
    if os.path.exists(out):
        print(f"{name}: on disk, kept", flush=True)
        return
    partial = os.path.join(RAW, name + ".part.jsonl")
    if os.path.exists(partial):
        os.unlink(partial)
    command = job_command(args, system, run, seed, threads, epochs, partial)
    with open(os.path.join(RAW, name + ".cmd"), "w") as f:
        f.write(" ".join(shlex.quote(c) for c in command) + "\n")
    print(f"{name}: {' '.join(command)}", flush=True)
    if system == "dptrain":
        subprocess.run(command, check=True)
    else:
        with open(partial, "w") as f:
            subprocess.run(command, check=True, stdout=f)
    with open(partial) as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    if last["epoch"] != epochs:
        sys.exit(f"error: {name} stopped after epoch {last['epoch']} of {epochs}")
    os.replace(partial, out)
    print(f"{name}: test acc {last['test_acc']:.4f}", flush=True)


def command_run(args):
    os.makedirs(RAW, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = args.runs.split(",")
    systems = args.systems.split(",")
    for seed in seeds:  # seed by seed, so a run cut short leaves every run with equal seeds
        for run in runs:
            for system in systems:
                run_job(args, system, run, seed, args.threads, args.epochs)


# ============================================================================================
# The report


def load_jobs():
    """{(system, run, width, threads, epochs): {seed: [epoch records]}} from the raw files."""
    jobs = {}
    for entry in sorted(os.listdir(RAW)):
        if not entry.endswith(".jsonl") or entry.endswith(".part.jsonl"):
            continue
        system, rest = entry[:-len(".jsonl")].split("-", 1)
        run, width, seed, threads, epochs = rest.rsplit("-", 4)
        key = (system, run, int(width[len("width"):]), int(threads[len("threads"):]),
               int(epochs[len("epochs"):]))
        with open(os.path.join(RAW, entry)) as f:
            records = [json.loads(line) for line in f if line.strip()]
        jobs.setdefault(key, {})[int(seed[len("seed"):])] = records
    return jobs


def spread(values):
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "n": len(values)}


def summarise(by_seed):
    """Per epoch, each measure's mean, min and max over the seeds that reached it."""
    epochs = min(len(records) for records in by_seed.values())
    rows = []
    for e in range(epochs):
        row = {"epoch": e + 1}
        for measure in ("train_loss", "train_acc", "test_acc", "seconds"):
            row[measure] = spread([records[e][measure] for records in by_seed.values()])
        rows.append(row)
    return rows


def acceptance(ours, peer):
    """dptrain's mean final test accuracy against the band the issue sets: the peer's
    seed-to-seed range, or its mean +- 0.01, whichever is wider."""
    band = (min(peer["min"], peer["mean"] - 0.01), max(peer["max"], peer["mean"] + 0.01))
    return {"band": band, "dptrain_mean": ours["mean"],
            "passed": band[0] <= ours["mean"] <= band[1]}


def cell(s, digits=3):
    if s["n"] == 1:
        return f"{s['mean']:.{digits}f}"
    return f"{s['mean']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


RUN_TITLES = {
    "one": "one replica, batch 256, lr 0.1",
    "two": "two replicas, batch 512, lr 0.2",
    "two-sync-bn": "two replicas, batch 512, lr 0.2, BatchNorm over the whole batch",
}
FIGURE_TITLES = {"one": "one replica, batch 256, lr 0.1", "two": "two replicas, batch 512, lr 0.2",
                 "two-sync-bn": "two replicas, batch 512, lr 0.2, sync-bn"}
COLOURS = {"dptrain": "#008000", "peer": "#ff7f0e"}
DASHES = {"dptrain": "", "peer": ' stroke-dasharray="7,4"'}


def draw_figure(summary, width):
    """Test accuracy per epoch, one panel per run: each seed thin, the mean thick."""
    panel_w, panel_h, left, top, gap = 300, 240, 56, 50, 64
    runs = [run for run in RUN_TITLES if run in summary]
    values = [r["test_acc"][k] for run in runs for system in summary[run]
              for r in summary[run][system]["epochs"] for k in ("min", "max")]
    lo = max(0.0, (int(min(values) * 20)) / 20)
    hi = min(1.0, (int(max(values) * 20) + 1) / 20)
    epochs = max(len(summary[run][s]["epochs"]) for run in runs for s in summary[run])
    total_w = left + len(runs) * (panel_w + gap) + 110
    total_h = top + panel_h + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
           f'viewBox="0 0 {total_w} {total_h}" font-family="DejaVu Sans, Arial, sans-serif">',
           f'<rect width="{total_w}" height="{total_h}" fill="#ffffff"/>',
           f'<text x="{total_w / 2:.1f}" y="20" text-anchor="middle" font-size="14">'
           f'Test accuracy per epoch: dptrain and the book\'s PyTorch code, ResNet-18 width '
           f'{width}, Fashion-MNIST, CPU</text>']
    for i, run in enumerate(runs):
        x0 = left + i * (panel_w + gap)

        def px(epoch):
            return x0 + (epoch - 1) / max(epochs - 1, 1) * panel_w

        def py(value):
            return top + (hi - value) / (hi - lo) * panel_h

        out.append(f'<text x="{x0 + panel_w / 2:.1f}" y="{top - 10}" text-anchor="middle" '
                   f'font-size="11">{FIGURE_TITLES[run]}</text>')
        out.append('<g stroke="#e3e3e3" stroke-width="1" shape-rendering="crispEdges">')
        for e in range(1, epochs + 1):
            out.append(f'<line x1="{px(e):.1f}" y1="{top}" x2="{px(e):.1f}" '
                       f'y2="{top + panel_h}"/>')
        step = 0.1 if hi - lo > 0.4 else 0.05
        ticks = [t / 100 for t in range(int(round(lo * 100)), int(round(hi * 100)) + 1,
                                        int(round(step * 100)))]
        for t in ticks:
            out.append(f'<line x1="{x0}" y1="{py(t):.1f}" x2="{x0 + panel_w}" y2="{py(t):.1f}"/>')
        out.append('</g>')
        out.append(f'<rect x="{x0}" y="{top}" width="{panel_w}" height="{panel_h}" fill="none" '
                   f'stroke="#333333" shape-rendering="crispEdges"/>')
        out.append('<g font-size="11" fill="#222222">')
        for e in range(1, epochs + 1):
            out.append(f'<text x="{px(e):.1f}" y="{top + panel_h + 16}" '
                       f'text-anchor="middle">{e}</text>')
        for t in ticks:
            out.append(f'<text x="{x0 - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:.2f}</text>')
        out.append(f'<text x="{x0 + panel_w / 2:.1f}" y="{top + panel_h + 34}" '
                   f'text-anchor="middle">epoch</text></g>')
        for system in ("peer", "dptrain"):
            if system not in summary[run]:
                continue
            style = (f'fill="none" stroke="{COLOURS[system]}" stroke-linejoin="round"'
                     f'{DASHES[system]}')
            for records in summary[run][system]["seeds"].values():
                points = " ".join(f"{px(r['epoch']):.1f},{py(r['test_acc']):.1f}"
                                  for r in records)
                out.append(f'<polyline points="{points}" {style} stroke-width="1" '
                           f'stroke-opacity="0.45"/>')
            points = " ".join(f"{px(r['epoch']):.1f},{py(r['test_acc']['mean']):.1f}"
                              for r in summary[run][system]["epochs"])
            out.append(f'<polyline class="mean" data-system="{system}" data-run="{run}" '
                       f'points="{points}" {style} stroke-width="2.5"/>')
    lx = left + len(runs) * (panel_w + gap) - gap + 14
    for k, (system, label) in enumerate((("dptrain", "dptrain"), ("peer", "PyTorch (book)"))):
        y = top + 14 + 22 * k
        out.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 26}" y2="{y}" stroke="{COLOURS[system]}" '
                   f'stroke-width="2.5"{DASHES[system]}/>')
        out.append(f'<text x="{lx + 32}" y="{y + 4}" font-size="11">{label}</text>')
    out.append(f'<text x="{lx}" y="{top + 70}" font-size="10" fill="#555555">thin: each seed'
               f'</text><text x="{lx}" y="{top + 84}" font-size="10" fill="#555555">thick: the '
               f'mean</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def command_report(args):
    jobs = load_jobs()
    # The tables: the 10-epoch runs on --threads threads (other thread counts feed the
    # quickstart's spread only).
    book = {key: by_seed for key, by_seed in jobs.items()
            if key[4] == 10 and key[3] == args.threads}
    if not book:
        sys.exit(f"error: {RAW} holds no 10-epoch runs; run `book_runs.py run` first")
    widths = {key[2] for key in book}
    if len(widths) != 1:
        sys.exit(f"error: {RAW} mixes widths {sorted(widths)}; report one at a time")
    width = widths.pop()
    summary = {}
    for (system, run, _, threads, _), by_seed in sorted(book.items()):
        summary.setdefault(run, {})[system] = {
            "threads": threads, "seeds": by_seed, "epochs": summarise(by_seed),
            "final_test_acc": spread([records[-1]["test_acc"] for records in by_seed.values()]),
            # Less noisy views of the same runs: the last epoch's training loss, the test
            # accuracy averaged over the last three epochs, and how much the test accuracy
            # swings from epoch to epoch inside one run (its standard deviation over epochs
            # 6-10, averaged over the seeds).
            "final_train_loss": spread([r[-1]["train_loss"] for r in by_seed.values()]),
            "last3_test_acc": spread([statistics.fmean(x["test_acc"] for x in r[-3:])
                                      for r in by_seed.values()]),
            "swing_test_acc": statistics.fmean(statistics.pstdev(x["test_acc"] for x in r[5:])
                                               for r in by_seed.values())}
    accepted = {run: acceptance(systems["dptrain"]["final_test_acc"],
                                systems["peer"]["final_test_acc"])
                for run, systems in summary.items() if "dptrain" in systems and "peer" in systems}
    quickstart = quickstart_spread(jobs, width)
    record = {"date": args.date, "machine": machine(), "width": width,
              "commands": commands(), "runs": summary, "acceptance": accepted,
              "quickstart": quickstart}
    base = os.path.join(args.out, f"{args.date}-cpu-book-runs")
    with open(base + ".json", "w") as f:
        json.dump(record, f, indent=1)
    with open(base + ".svg", "w") as f:
        f.write(draw_figure(summary, width))
    with open(base + ".md", "w") as f:
        f.write(markdown(record, os.path.basename(base)))
    print(open(base + ".md").read())


def quickstart_spread(jobs, width):
    """Test accuracy after each epoch of the one-replica run, over every seed and thread count
    on disk: the quickstart is the first epochs of that run, so its spread is read off here."""
    by_epoch = {}
    for (system, run, w, threads, _), by_seed in jobs.items():
        if system != "dptrain" or run != "one" or w != width:
            continue
        for seed, records in by_seed.items():
            for r in records:
                by_epoch.setdefault(r["epoch"], {})[f"seed {seed}, {threads} threads"] = \
                    r["test_acc"]
    return {str(epoch): values for epoch, values in sorted(by_epoch.items())}


def machine():
    from run_bench import cpu_model  # the bench's one reader of the CPU's name
    with open("/proc/cpuinfo") as f:
        avx512f = " avx512f" in f.read()
    return {"cpu": cpu_model(), "avx512f": avx512f, "cores": os.cpu_count(),
            "python": platform.python_version()}


def commands():
    out = {}
    for entry in sorted(os.listdir(RAW)):
        if entry.endswith(".cmd"):
            with open(os.path.join(RAW, entry)) as f:
                out[entry[:-len(".cmd")]] = f.read().strip()
    return out


def markdown(record, base):
    m = record["machine"]
    lines = [f"# The book's runs on CPU: dptrain beside the book's PyTorch code, {record['date']}",
             "",
             f"Machine: {m['cpu']} ({'AVX-512' if m['avx512f'] else 'no AVX-512'}), "
             f"{m['cores']} cores. ResNet-18 at width {record['width']} (the book's is 64), "
             "the full 60,000 training and 10,000 test images, 10 epochs, plain SGD, "
             "N(0, 0.01) weights, the CPU's default layout (contiguous). dptrain on Debian's "
             "LibTorch 1.13.1; the peer is `bench/book_peer.py` on Debian's PyTorch 1.13.",
             "",
             "Each cell: the mean over seeds, then (min–max). Train loss and accuracy are the "
             "epoch's running means, as the book's train function reports them; test accuracy "
             "is after the epoch, on all 10,000 images. sec/epoch counts training only, on a "
             "machine that was also building code at times: it is no speed claim "
             "(`bench/run_bench.py` is).",
             "", f"![test accuracy per epoch]({base}.svg)", ""]
    for run, systems in record["runs"].items():
        lines += [f"## {RUN_TITLES.get(run, run)}", ""]
        present = [s for s in SYSTEMS if s in systems]
        seeds = {s: sorted(systems[s]["seeds"]) for s in present}
        lines.append("Seeds: " + "; ".join(f"{s} {seeds[s]} on {systems[s]['threads']} threads"
                                           for s in present) + ".")
        lines.append("")
        header = "| epoch |"
        rule = "|---|"
        for s in present:
            header += f" {s} train loss | {s} train acc | {s} test acc | {s} sec |"
            rule += "---|---|---|---|"
        lines += [header, rule]
        for e in range(max(len(systems[s]["epochs"]) for s in present)):
            row = f"| {e + 1} |"
            for s in present:
                if e < len(systems[s]["epochs"]):
                    r = systems[s]["epochs"][e]
                    row += (f" {cell(r['train_loss'])} | {cell(r['train_acc'])} | "
                            f"{cell(r['test_acc'])} | {r['seconds']['mean']:.1f} |")
                else:
                    row += " | | | |"
            lines.append(row)
        lines.append("")
        if run in record["acceptance"]:
            a = record["acceptance"][run]
            lines.append(f"Final test accuracy: dptrain {cell(systems['dptrain']['final_test_acc'])}"
                         f", peer {cell(systems['peer']['final_test_acc'])}. The band the issue "
                         f"sets (the peer's range or its mean ± 0.01, the wider) is "
                         f"{a['band'][0]:.4f}–{a['band'][1]:.4f}: dptrain's mean "
                         f"{a['dptrain_mean']:.4f} is **{'inside' if a['passed'] else 'OUTSIDE'}"
                         f"**.")
            lines.append("")
            d, p = systems["dptrain"], systems["peer"]
            lines.append(f"Less noisy views: the last epoch's train loss, dptrain "
                         f"{cell(d['final_train_loss'])}, peer {cell(p['final_train_loss'])}; "
                         f"test accuracy averaged over epochs 8-10, dptrain "
                         f"{cell(d['last3_test_acc'])}, peer {cell(p['last3_test_acc'])}. Inside "
                         f"one run the test accuracy swings from epoch to epoch by "
                         f"{d['swing_test_acc']:.3f} (dptrain) and {p['swing_test_acc']:.3f} "
                         f"(peer), a standard deviation over epochs 6-10.")
            lines.append("")
    q = record["quickstart"]
    if q:
        lines += ["## The quickstart's spread", "",
                  "The CPU quickstart (`scripts/quickstart.sh`) is the one-replica run above: "
                  "its printed result is the last row. Test accuracy after each epoch over "
                  "every seed and thread count measured (seeds 0-2, 1 and 2 threads):", "",
                  "| epochs | runs | min | max | range |", "|---|---|---|---|---|"]
        for epoch, values in q.items():
            v = list(values.values())
            lines.append(f"| {epoch} | {len(v)} | {min(v):.4f} | {max(v):.4f} | "
                         f"{max(v) - min(v):.4f} |")
        lines.append("")
    lines += ["## Commands", "", "```", "/usr/bin/python3 bench/book_runs.py run --seeds 0,1",
              "/usr/bin/python3 bench/book_runs.py run --seeds 2 --runs one,two",
              "/usr/bin/python3 bench/book_runs.py run --seeds 0,1,2 --runs one "
              "--systems dptrain --threads 1",
              "/usr/bin/python3 bench/book_runs.py report", "```", "",
              "Each job's exact command line is in `bench/results/book-runs/<job>.cmd`, and in "
              "the JSON."]
    return "\n".join(lines) + "\n"


def main():
    global RAW
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the jobs not yet on disk")
    run.add_argument("--dptrain", default=os.path.join(HERE, "..", "build", "app", "dptrain"))
    run.add_argument("--python", default=sys.executable, help="the Python that runs the peer")
    run.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    run.add_argument("--width", type=int, default=8)
    run.add_argument("--epochs", type=int, default=10)
    run.add_argument("--threads", type=int, default=2)
    run.add_argument("--seeds", default="0,1")
    run.add_argument("--runs", default=",".join(RUNS))
    run.add_argument("--systems", default=",".join(SYSTEMS))
    report = sub.add_parser("report", help="write the tables and the figure")
    report.add_argument("--out", default=os.path.join(HERE, "results"))
    report.add_argument("--date", default=datetime.date.today().isoformat())
    report.add_argument("--threads", type=int, default=2, help="the runs the tables show")
    for p in (run, report):
        p.add_argument("--raw", default=RAW, help="where the per-job records are kept")
    args = parser.parse_args()
    RAW = args.raw
    if args.command == "run":
        command_run(args)
    else:
        command_report(args)


if __name__ == "__main__":
    main()
