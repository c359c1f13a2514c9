#!/usr/bin/env python3
"""Compares the outputs of two dptrain runs made with the same flags and seed: the metrics files
(JSON Lines, CSV), the TensorBoard events, the checkpoints and saved models. Everything must be
the same byte for byte but the figures a run measures rather than computes (times, speeds, memory
peaks), which differ from run to run: each is masked, keeping only whether it is missing.
Prints one line per difference and exits 1 if there is any. Not here: comparing the weights of
two models that may differ (compare_models.py).

    python3 scripts/compare_outputs.py BEFORE AFTER     # folders holding the same file names

Reads *.jsonl, *.csv, *.safetensors (any depth) and the event files under tb/ (needs PyPI
tensorboard and safetensors: scripts/test-venv.sh's .venv-tests has both).
"""
import json
import os
import re
import struct
import sys

# The measured figures (lib/include/dptrain/train/epoch_figures.def), and the run state's seconds
# of its unfinished epoch.
MEASURED = ("seconds", "images_per_second", "steady_seconds", "wall_ms_per_step",
            "gpu_ms_per_step", "tflops", "mfu", "peak_host_bytes", "peak_device_bytes",
            "gpu_samples_dropped", "gpu_spin_ms", "eval_seconds", "partial_seconds")
# The JSON value of a measured key: a number, null, or the run state's "nan"/"inf" strings.
MEASURED_JSON = re.compile(r'"(%s)":(-?[0-9][0-9.eE+-]*)' % "|".join(MEASURED))


def masked_json_text(text):
    """`text` with every measured number replaced by T (null and "nan" stay as they are)."""
    return MEASURED_JSON.sub(lambda m: f'"{m.group(1)}":T', text)


def masked_csv_text(text):
    lines = text.split("\n")
    header = lines[0].split(",")
    measured = {i for i, name in enumerate(header) if name in MEASURED}
    out = [lines[0]]
    for line in lines[1:]:
        # The devices column is last and may be quoted with commas in it: split only the numbers.
        cells = line.split(",", len(header) - 1)
        out.append(",".join("T" if i in measured and cell else cell
                            for i, cell in enumerate(cells)))
    return "\n".join(out)


def safetensors_parts(path):
    """The header JSON (its run state masked, its digest dropped: the digest covers the run
    state's times) and the data bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack_from("<Q", raw)[0]
    header = json.loads(raw[8:8 + n])
    metadata = header.get("__metadata__", {})
    metadata.pop("dptrain.digest", None)
    if "dptrain.run_state" in metadata:
        metadata["dptrain.run_state"] = masked_json_text(metadata["dptrain.run_state"])
    return json.dumps(header, indent=1), raw[8 + n:]


def tensorboard_events(folder):
    """Every event of every event file under `folder`, in file-name order, wall times dropped
    and measured scalars masked, as text."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    events = []
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(f for f in files if ".tfevents." in f):
            events.append(f"file in {os.path.relpath(root, folder)}")
            for event in EventFileLoader(os.path.join(root, name)).Load():
                event.wall_time = 0
                for value in event.summary.value:
                    if value.tag.split("/")[-1] in MEASURED:
                        value.simple_value = 1.0
                events.append(str(event))
    return events


def differences(before, after):
    """One line per difference between the two folders' outputs."""
    found = []
    names = sorted({os.path.relpath(os.path.join(r, f), before)
                    for r, _, fs in os.walk(before) for f in fs})
    for name in names:
        a, b = os.path.join(before, name), os.path.join(after, name)
        if ".tfevents." in name:
            continue  # compared per folder below: the file names hold the start time and pid
        if not os.path.exists(b):
            found.append(f"{name}: missing after")
        elif name.endswith((".jsonl", ".csv")):
            mask = masked_csv_text if name.endswith(".csv") else masked_json_text
            ta, tb = (mask(open(p, encoding="utf-8").read()) for p in (a, b))
            for i, (la, lb) in enumerate(zip(ta.split("\n"), tb.split("\n"))):
                if la != lb:
                    found.append(f"{name} line {i + 1}:\n  before {la}\n  after  {lb}")
            if ta.count("\n") != tb.count("\n"):
                found.append(f"{name}: {ta.count(chr(10))} lines before, {tb.count(chr(10))} after")
        elif name.endswith(".safetensors"):
            (ha, da), (hb, db) = safetensors_parts(a), safetensors_parts(b)
            if ha != hb:
                found.append(f"{name}: the header differs:\n{ha}\n{hb}")
            if da != db:
                found.append(f"{name}: the tensors' bytes differ")
    if os.path.isdir(os.path.join(before, "tb")):
        ea, eb = (tensorboard_events(os.path.join(d, "tb")) for d in (before, after))
        if ea != eb:
            first = next((i for i, (x, y) in enumerate(zip(ea, eb)) if x != y), min(len(ea), len(eb)))
            found.append(f"tb: event {first} differs ({len(ea)} events before, {len(eb)} after):\n"
                         f"{ea[first] if first < len(ea) else '(none)'}\n"
                         f"{eb[first] if first < len(eb) else '(none)'}")
    return found


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    found = differences(sys.argv[1], sys.argv[2])
    for line in found:
        print(line)
    print(f"{len(found)} differences" if found else "the same, measured figures masked")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
