#!/usr/bin/env python3
"""dptrain's --tensorboard files read back by TensorBoard's own reader (PyPI tensorboard's
EventAccumulator, as `tensorboard --logdir` reads them): every per-epoch scalar equals the
metrics file's column of the same name (to float32), the running loss sits every N steps, the
settings are a text summary; and a run stopped and resumed, or crashed after its last checkpoint
and resumed, has every step once. Prints what the reader lists. Not here: the framing's bytes and
the writer's errors (tests/report/test_tensorboard.cpp).

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
import struct
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# A tiny run: 512 images in batches of 64 are 8 steps per epoch, 16 in two epochs, with the
# running loss every 3 steps (3, 6, 9, 12, 15). Width 4 trains an epoch in about a second.
STEPS_PER_EPOCH = 8
EVERY = 3
COMMON = ["--width", "4", "--batch-size", "64", "--train-limit", "512", "--test-limit", "256",
          "--epochs", "2", "--threads", "1", "--tensorboard-every", str(EVERY)]
# The metrics file's columns that --tensorboard logs as epoch/<column>, where they are finite.
EPOCH_COLUMNS = ["train_loss", "train_acc", "test_loss", "test_acc", "seconds",
                 "images_per_second", "wall_ms_per_step", "gpu_ms_per_step", "tflops", "mfu",
                 "peak_host_bytes", "peak_device_bytes"]
# What two runs of the same settings and seed give alike, whatever the timing.
TRAINING_COLUMNS = ["train_loss", "train_acc", "test_loss", "test_acc"]

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL: " + message)


def float32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def run(dptrain, *args):
    done = subprocess.run([dptrain, "train", *COMMON, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"error: dptrain train {' '.join(args)} exited {done.returncode}:\n"
                         f"{done.stdout}{done.stderr}")
    return done.stdout


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
        files = [n for n in os.listdir(path("a")) if "tfevents" in n]
        check(len(files) == 1, f"one event file expected, found {files}")
        scalars, texts = read(path("a"))
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
        files = sorted(n for n in os.listdir(path("b")) if "tfevents" in n)
        check(len(files) == 2, f"two event files expected (stopped, resumed), found {files}")
        scalars, texts = read(path("b"))
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
        unpurged, _ = read(path("c"), purge=False)
        check(len(unpurged.get("epoch/train_loss", [])) == 4,
              f"without the purge, each epoch twice: {unpurged.get('epoch/train_loss')}")
        scalars, texts = read(path("c"))
        listing("crashed after the checkpoint at step 5, resumed", scalars, texts)
        check_every_step_once("crashed and resumed", scalars)
        check([s for s, _ in scalars.get("step/train_loss", [])] == [3, 6, 9, 12, 15],
              f"crashed: step/train_loss at {scalars.get('step/train_loss')}")
        check_epochs_match_metrics("crashed and resumed", scalars, metrics(path("c.jsonl")),
                                   columns=TRAINING_COLUMNS)
        check_same_training("crashed and resumed", scalars, uninterrupted)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
