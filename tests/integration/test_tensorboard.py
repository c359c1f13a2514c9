#!/usr/bin/env python3
"""dptrain's --tensorboard files read back by TensorBoard's own reader (PyPI tensorboard's
EventAccumulator and EventMultiplexer, as `tensorboard --logdir` reads them): every per-epoch
scalar equals the metrics file's column of the same name (to float32), the running loss sits every
N steps, the settings are a text summary; a run stopped and resumed, or crashed after its last
checkpoint and resumed, has every step once, in the run folder it began; two runs one after the
other into one directory are two runs side by side, each whole; a second run while one is live
is refused naming the holder; an epoch without a trained step has no training points. Prints
what the reader lists. Not here: the framing's bytes, the run folders' choice and the writer's
errors (tests/report/test_tensorboard.cpp).

    .venv-tests/bin/python3 tests/integration/test_tensorboard.py --dptrain build/app/dptrain

Needs Fashion-MNIST where dptrain finds it ($DPTRAIN_DATA, or Debian's dataset-fashion-mnist).
"""
import argparse
import json
import logging
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

# A tiny run: 512 images in batches of 64 are 8 steps per epoch, 16 in two epochs, with the
# running loss every 3 steps (3, 6, 9, 12, 15). Width 4 trains an epoch in about a second.
STEPS_PER_EPOCH = 8
EVERY = 3
COMMON = ["--width", "4", "--batch-size", "64", "--train-limit", "512", "--test-limit", "256",
          "--epochs", "2", "--threads", "1", "--tensorboard-every", str(EVERY)]
# The metrics file's columns that --tensorboard logs as epoch/<column>, where they are finite.
EPOCH_COLUMNS = ["train_loss", "train_acc", "test_loss", "test_acc", "seconds",
                 "images_per_second", "wall_ms_per_step", "gpu_ms_per_step", "tflops", "mfu",
                 "peak_host_bytes", "peak_device_bytes", "val_loss", "val_acc"]
# What two runs of the same settings and seed give alike, whatever the timing.
TRAINING_COLUMNS = ["train_loss", "train_acc", "test_loss", "test_acc"]

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL: " + message)


def float32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def run(dptrain, *args, status=0):
    done = subprocess.run([dptrain, "train", *COMMON, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=600)
    if done.returncode != status:
        raise SystemExit(f"error: dptrain train {' '.join(args)} exited {done.returncode}, not "
                         f"{status}:\n{done.stdout}{done.stderr}")
    return done


def event_files(directory):
    return sorted(n for n in os.listdir(directory) if "tfevents" in n)


def runs_of(directory):
    """TensorBoard's runs under a --logdir: {run: {tag: [(step, value)]}}."""
    multiplexer = EventMultiplexer(size_guidance={"scalars": 0})
    multiplexer.AddRunsFromDirectory(directory)
    multiplexer.Reload()
    return {name: {tag: [(e.step, e.value) for e in multiplexer.Scalars(name, tag)]
                   for tag in multiplexer.GetAccumulator(name).Tags()["scalars"]}
            for name in multiplexer.Runs()}


def read(directory, purge=True):
    """TensorBoard's reader on a directory: {tag: [(step, value)]} and the text summaries."""
    reader = EventAccumulator(directory, size_guidance={"scalars": 0, "tensors": 0},
                              purge_orphaned_data=purge)
    reader.Reload()
    scalars = {tag: [(e.step, e.value) for e in reader.Scalars(tag)]
               for tag in reader.Tags()["scalars"]}
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in reader.Tensors(tag)]
             for tag in reader.Tags()["tensors"]}
    return scalars, texts


def listing(title, scalars, texts):
    print(f"--- {title}: TensorBoard's EventAccumulator lists")
    for tag in sorted(scalars):
        points = ", ".join(f"{step}: {value:.6g}" for step, value in scalars[tag])
        print(f"  {tag} [{len(scalars[tag])}] {points}")
    for tag in sorted(texts):
        for step, text in texts[tag]:
            rows = text.strip().split("\n")
            print(f"  {tag} (text) at step {step}: a table of {len(rows) - 2} settings, e.g. "
                  f"{rows[2]} {rows[3]}")


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def check_every_step_once(name, scalars):
    for tag, points in scalars.items():
        steps = [step for step, _ in points]
        check(steps == sorted(set(steps)),
              f"{name}: {tag}'s steps are not strictly increasing: {steps}")


def check_epochs_match_metrics(name, scalars, records, columns=EPOCH_COLUMNS):
    """Every finite column of every record is its epoch/<column> at the epoch's last step, to
    float32; every epoch/* tag is such a column; each epoch's step appears once."""
    for tag in scalars:
        if tag.startswith("epoch/"):
            check(tag[len("epoch/"):] in EPOCH_COLUMNS, f"{name}: {tag} is no metrics column")
    for record in records:
        step = record["epoch"] * STEPS_PER_EPOCH
        for column in columns:
            value = record.get(column)
            at_step = [v for s, v in scalars.get("epoch/" + column, []) if s == step]
            if value is None:
                check(not at_step, f"{name}: epoch {record['epoch']}: {column} is missing in "
                      f"the metrics file but TensorBoard has {at_step}")
                continue
            check(at_step == [float32(value)],
                  f"{name}: epoch {record['epoch']}: epoch/{column} at step {step} is {at_step}, "
                  f"the metrics file's {value} (float32 {float32(value)})")


def check_same_training(name, scalars, reference):
    """The training figures of `scalars` equal those of an uninterrupted run (to float32)."""
    for column in TRAINING_COLUMNS:
        tag = "epoch/" + column
        got, want = scalars.get(tag, []), reference.get(tag, [])
        check([s for s, _ in got] == [s for s, _ in want],
              f"{name}: {tag} at steps {[s for s, _ in got]}, uninterrupted {[s for s, _ in want]}")
        for (step, value), (_, expected) in zip(got, want):
            check(math.isclose(value, expected, rel_tol=1e-5),
                  f"{name}: {tag} at step {step} is {value}, uninterrupted {expected}")


def check_runs_side_by_side(dptrain, path):
    """Two fresh runs one after the other into one directory (seeds 1 and 2): TensorBoard lists
    run-1 and run-2, each with both of its epochs as its own metrics file has them. (Into one
    folder, the second run's start marker at step 1 would hide the first run.)"""
    for seed in ("1", "2"):
        run(dptrain, "--seed", seed, "--metrics", path(f"d{seed}.jsonl"), "--tensorboard",
            path("d"))
    runs = runs_of(path("d"))
    print("--- two runs one after the other into one directory: TensorBoard's runs")
    for name in sorted(runs):
        print(f"  {name}: epoch/train_loss {runs[name].get('epoch/train_loss')}")
    check(sorted(runs) == ["run-1", "run-2"], f"side by side: the runs are {sorted(runs)}")
    for seed in ("1", "2"):
        scalars = runs.get("run-" + seed, {})
        records = metrics(path(f"d{seed}.jsonl"))
        check_epochs_match_metrics(f"side by side, run-{seed}", scalars, records)
        check([s for s, _ in scalars.get("epoch/train_loss", [])] == [8, 16],
              f"side by side, run-{seed}: epoch/train_loss at "
              f"{scalars.get('epoch/train_loss')}, expected steps 8 and 16")
    first, second = metrics(path("d1.jsonl")), metrics(path("d2.jsonl"))
    check(first[0]["train_loss"] != second[0]["train_loss"],
          "side by side: seeds 1 and 2 should train differently")


def check_a_validation_split(dptrain, path):
    """--val-split 64 of 576 images leaves the 512 of the other runs (8 steps an epoch): its
    validation loss and accuracy are logged beside the test's, as the metrics file has them;
    without it (the runs above) neither is."""
    args = list(COMMON)
    args[args.index("--train-limit") + 1] = "576"
    done = subprocess.run([dptrain, "train", *args, "--val-split", "64", "--metrics",
                           path("v.jsonl"), "--tensorboard", path("v")], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=600)
    check(done.returncode == 0, f"--val-split: exit {done.returncode}: {done.stderr.strip()}")
    scalars, _ = read(path("v/run-1"))
    records = metrics(path("v.jsonl"))
    check_epochs_match_metrics("a validation split", scalars, records)
    check([s for s, _ in scalars.get("epoch/val_acc", [])] == [8, 16],
          f"--val-split: epoch/val_acc at {scalars.get('epoch/val_acc')}, expected steps 8, 16")
    check(all(r["val_acc"] is not None and r["val_acc"] * 64 == round(r["val_acc"] * 64)
              for r in records), f"--val-split: val_acc of 64 images: {records}")


def check_a_live_writer_refuses_another(dptrain, path):
    """A run into a directory that a live run writes is refused in one line naming the holder,
    and leaves the live run's records whole. The live run is held still (SIGSTOP) once it has
    taken the directory, so that it is surely live when the second one starts."""
    live = subprocess.Popen([dptrain, "train", *COMMON, "--metrics", path("e.jsonl"),
                             "--tensorboard", path("e")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # The lock file appears before the data is read; the event file (all an unlocked writer
    # leaves) once the run has started.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and live.poll() is None:
        taken = os.path.exists(path("e/.dptrain-writer.lock")) or any(
            "tfevents" in name for _, _, names in os.walk(path("e")) for name in names)
        if taken:
            break
        time.sleep(0.01)
    os.kill(live.pid, signal.SIGSTOP)
    try:
        second = subprocess.run([dptrain, "train", *COMMON, "--seed", "2", "--tensorboard",
                                 path("e")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, timeout=600)
    finally:
        os.kill(live.pid, signal.SIGCONT)
    out, err = live.communicate(timeout=600)
    print("--- a second run while one writes the directory:")
    print(f"  exit {second.returncode}: {second.stderr.strip()}")
    lines = second.stderr.strip().split("\n")
    check(second.returncode == 2, f"the second run exited {second.returncode}, expected 2 "
          f"(refused):\n{second.stdout}{second.stderr}")
    check(len(lines) == 1 and lines[0].startswith(
        f"error: --tensorboard {path('e')} is being written by another dptrain run (pid "
        f"{live.pid} on "), f"the refusal should be one line naming pid {live.pid}: {lines}")
    check(live.returncode == 0, f"the live run exited {live.returncode}:\n{out}{err}")
    check(sorted(os.listdir(path("e"))) == ["run-1"],
          f"live and refused: one run folder expected, found {sorted(os.listdir(path('e')))}")
    scalars, _ = read(path("e/run-1"))
    check_epochs_match_metrics("the live run", scalars, metrics(path("e.jsonl")))
    check([s for s, _ in scalars.get("epoch/train_loss", [])] == [8, 16],
          f"the live run: epoch/train_loss at {scalars.get('epoch/train_loss')}")


def check_an_epoch_without_a_trained_step(dptrain, path):
    """--lr 1e30 --on-nonfinite skip: epoch 1 trains its first step only; resumed for epoch 2,
    every step is skipped. Epoch 2 has its test figures but no training point (no loss,
    accuracy or pace), the metrics file has null there, and the resumed run, which trained
    nothing, exits 1 in one line without writing --save-model."""
    diverging = ["--lr", "1e30", "--on-nonfinite", "skip", "--checkpoint-dir", path("f-ck"),
                 "--tensorboard", path("f")]
    run(dptrain, *diverging, "--epochs", "1")
    done = run(dptrain, *diverging, "--resume", "--metrics", path("f.jsonl"), "--save-model",
               path("f.safetensors"), status=1)
    scalars, texts = read(path("f/run-1"))
    listing("an epoch without a trained step (epoch 2)", scalars, texts)
    print(f"  the run's error: {done.stderr.strip()}")
    records = metrics(path("f.jsonl"))
    check([(r["train_loss"], r["train_acc"], r["images_per_second"]) for r in records[1:]] ==
          [(None, None, None)], f"no step trained: the metrics file's epoch 2 is {records[1:]}")
    check_epochs_match_metrics("no step trained", scalars, records)
    for column in ("train_loss", "train_acc", "images_per_second"):
        check([s for s, _ in scalars.get("epoch/" + column, [])] == [8],
              f"no step trained: epoch/{column} at {scalars.get('epoch/' + column)}, expected "
              "step 8 only (epoch 2 trained nothing)")
    for column in ("test_acc", "seconds", "wall_ms_per_step"):
        check([s for s, _ in scalars.get("epoch/" + column, [])] == [8, 16],
              f"no step trained: epoch/{column} at {scalars.get('epoch/' + column)}, expected "
              "8 and 16")
    check(len(done.stderr.strip().split("\n")) == 1 and
          done.stderr.startswith("error: no step of this run trained: all 8 of its steps"),
          f"no step trained: the run's error: {done.stderr}")
    check(not os.path.exists(path("f.safetensors")),
          "no step trained: --save-model was written")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dptrain", required=True)
    dptrain = parser.parse_args().dptrain
    # The reader's purge messages, so that the output shows a resume's purge at work.
    logging.basicConfig(level=logging.WARNING, format="  reader: %(message)s")
    work = tempfile.mkdtemp(prefix="dptrain_tensorboard_test.")
    try:
        path = lambda name: os.path.join(work, name)  # noqa: E731

        # ---- Two epochs, uninterrupted: every scalar against the metrics file.
        run(dptrain, "--metrics", path("a.jsonl"), "--tensorboard", path("a"))
        # The run's folder, and nothing else: the writer's lock file is gone with the writer.
        check(sorted(os.listdir(path("a"))) == ["run-1"],
              f"a: one run folder expected, found {sorted(os.listdir(path('a')))}")
        files = event_files(path("a/run-1"))
        check(len(files) == 1, f"one event file expected, found {files}")
        scalars, texts = read(path("a/run-1"))
        listing("a two-epoch run", scalars, texts)
        records = metrics(path("a.jsonl"))
        check([r["epoch"] for r in records] == [1, 2], f"the metrics file's epochs: {records}")
        check_epochs_match_metrics("two epochs", scalars, records)
        check_every_step_once("two epochs", scalars)
        for column in TRAINING_COLUMNS + ["seconds", "images_per_second", "wall_ms_per_step"]:
            check([s for s, _ in scalars.get("epoch/" + column, [])] == [8, 16],
                  f"epoch/{column} should be at steps 8 and 16")
        loss = scalars.get("step/train_loss", [])
        check([s for s, _ in loss] == [3, 6, 9, 12, 15],
              f"step/train_loss at steps {[s for s, _ in loss]}, expected 3, 6, 9, 12, 15")
        check(all(0 < v < 10 for _, v in loss), f"step/train_loss values {loss}")
        settings = texts.get("run/settings", [])
        check(len(settings) == 1 and settings[0][0] == 1, f"run/settings at {settings}")
        check(settings and "| --width | 4 |" in settings[0][1] and
              "| --tensorboard-every | 3 |" in settings[0][1], f"the settings table: {settings}")
        uninterrupted = scalars

        # ---- Stopped by --max-steps inside epoch 2, then resumed: every step once.
        run(dptrain, "--max-steps", "11", "--checkpoint-dir", path("b-ck"),
            "--metrics", path("b.jsonl"), "--tensorboard", path("b"))
        run(dptrain, "--resume", "--checkpoint-dir", path("b-ck"), "--metrics", path("b.jsonl"),
            "--tensorboard", path("b"))
        # The resumed run continues the stopped run's folder (Note [One folder per run]).
        check(sorted(os.listdir(path("b"))) == ["run-1"],
              f"resumed: one run folder expected, found {sorted(os.listdir(path('b')))}")
        files = event_files(path("b/run-1"))
        check(len(files) == 2, f"two event files expected (stopped, resumed), found {files}")
        scalars, texts = read(path("b/run-1"))
        listing("stopped at step 11 (--max-steps), resumed", scalars, texts)
        check_every_step_once("stopped and resumed", scalars)
        check([s for s, _ in scalars.get("step/train_loss", [])] == [3, 6, 9, 12, 15],
              f"resumed: step/train_loss at {scalars.get('step/train_loss')}")
        check([s for s, _ in texts.get("run/settings", [])] == [1, 12],
              f"resumed: run/settings at {texts.get('run/settings')}: each run's start")
        # The resumed run's metrics file holds both epochs; epoch 1 came from the stopped run's
        # file. The training figures match the uninterrupted run's.
        check_epochs_match_metrics("stopped and resumed", scalars, metrics(path("b.jsonl")),
                                   columns=TRAINING_COLUMNS)
        check_same_training("stopped and resumed", scalars, uninterrupted)

        # ---- Crashed after its last checkpoint: the run went on to the end (steps 6 to 16
        # logged), but only the checkpoint at step 5 survived. The resume trains 6 on again, and
        # its START marker at step 6 makes the reader drop the first file's steps 6 to 16.
        run(dptrain, "--checkpoint-dir", path("c-ck"), "--checkpoint-every-steps", "5",
            "--tensorboard", path("c"))
        kept = 0
        for name in os.listdir(path("c-ck")):
            match = re.match(r"checkpoint-e(\d+)-s(\d+)", name)
            if match:
                step = int(match.group(1)) * STEPS_PER_EPOCH + int(match.group(2))
                if step > 5:
                    os.remove(os.path.join(path("c-ck"), name))
                else:
                    kept += 1
        check(kept >= 1, "the checkpoint at step 5 should be there")
        run(dptrain, "--resume", "--checkpoint-dir", path("c-ck"), "--metrics", path("c.jsonl"),
            "--tensorboard", path("c"))
        check(sorted(os.listdir(path("c"))) == ["run-1"],
              f"crashed: one run folder expected, found {sorted(os.listdir(path('c')))}")
        unpurged, _ = read(path("c/run-1"), purge=False)
        check(len(unpurged.get("epoch/train_loss", [])) == 4,
              f"without the purge, each epoch twice: {unpurged.get('epoch/train_loss')}")
        scalars, texts = read(path("c/run-1"))
        listing("crashed after the checkpoint at step 5, resumed", scalars, texts)
        check_every_step_once("crashed and resumed", scalars)
        check([s for s, _ in scalars.get("step/train_loss", [])] == [3, 6, 9, 12, 15],
              f"crashed: step/train_loss at {scalars.get('step/train_loss')}")
        check_epochs_match_metrics("crashed and resumed", scalars, metrics(path("c.jsonl")),
                                   columns=TRAINING_COLUMNS)
        check_same_training("crashed and resumed", scalars, uninterrupted)

        check("epoch/val_acc" not in uninterrupted, "without --val-split: an epoch/val_acc")
        check_runs_side_by_side(dptrain, path)
        check_a_validation_split(dptrain, path)
        check_a_live_writer_refuses_another(dptrain, path)
        check_an_epoch_without_a_trained_step(dptrain, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
