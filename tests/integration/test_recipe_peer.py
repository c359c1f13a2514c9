#!/usr/bin/env python3
"""bench/recipe_peer.py (the PyTorch peer of issue 54's recipes) and bench/time_to_accuracy.py
held to exact figures: the LambdaLR factors against the formula of each schedule at chosen
steps, the crop-and-flip augmentation (shapes, a seed's draws, offset P without a flip is the
image itself, a flip is the mirror, offset 0 a shift), the decay groups, the EMA's arithmetic,
the fixed validation split, a tiny end-to-end run with every recipe flag on (twice: the same
figures), and the time-to-accuracy arithmetic, order and report over stub programs.

    .venv-tests/bin/python3 tests/integration/test_recipe_peer.py [-v]   # scripts/test-venv.sh

Needs torch (Debian's python3-torch 1.13 or 2.x) and, for the end-to-end run, Fashion-MNIST
($DPTRAIN_DATA or /usr/share/datasets/fashion-mnist); without it that test fails saying so.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.optim import swa_utils  # noqa: E402

import recipe_peer as peer  # noqa: E402
import time_to_accuracy as tta  # noqa: E402

DATA_DIRS = (os.environ.get("DPTRAIN_DATA"), "/usr/share/datasets/fashion-mnist",
             "data/fashion-mnist")


def recipe_args(**overrides):
    """The peer's parsed flags with every recipe flag at its default, then `overrides`."""
    args = peer.parser().parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


class Schedule(unittest.TestCase):
    # S = 4 steps an epoch, 3 epochs: T = 12; --warmup-epochs 0.5: W = 2.
    def factor(self, step, schedule, warmup=0.5, **kw):
        return peer.lr_factor(step, 4, 3, schedule, warmup, **kw)

    def test_warmup_is_linear_to_one(self):
        for schedule in ("constant", "cosine", "onecycle"):
            self.assertEqual(self.factor(0, schedule), 0.5)
            self.assertEqual(self.factor(1, schedule), 1.0)

    def test_cosine_and_onecycle_at_chosen_steps(self):
        self.assertEqual(self.factor(2, "cosine"), 1.0)
        self.assertEqual(self.factor(7, "cosine"), 0.5 * (1 + math.cos(math.pi * 5 / 10)))
        self.assertEqual(self.factor(11, "cosine"), 0.5 * (1 + math.cos(math.pi * 9 / 10)))
        self.assertEqual([self.factor(s, "onecycle") for s in (2, 7, 11)], [1.0, 0.5, 0.1])
        self.assertEqual(self.factor(9, "constant"), 1.0)

    def test_step_schedule_decays_every_n_epochs(self):
        factors = [self.factor(s, "step", 0.0, step_epochs=1, gamma=0.1) for s in range(12)]
        self.assertEqual(factors, [1.0] * 4 + [0.1] * 4 + [0.1 ** 2] * 4)

    def test_warmup_steps_round_half_away_from_zero(self):
        # 0.625 epochs of 4 steps = 2.5 steps: W = 3, as C++'s std::round (Python's round: 2)
        self.assertEqual(peer.lr_factor(1, 4, 3, "constant", 0.625), 2 / 3)
        self.assertEqual(peer.lr_factor(2, 4, 3, "constant", 0.625), 1.0)
        # a warm-up longer than the run ends with the run: 5 epochs' worth over T = 12 steps
        self.assertEqual(peer.lr_factor(5, 4, 3, "onecycle", 5.0), 0.5)

    def test_lambdalr_gives_each_step_the_formulas_rate(self):
        args = recipe_args(lr=0.2, epochs=3, lr_schedule="onecycle", warmup_epochs=0.5,
                           momentum=0.9, nesterov=True)
        weight = nn.Parameter(torch.zeros(3))
        optimizer = torch.optim.SGD([weight], lr=args.lr, momentum=0.9, nesterov=True)
        scheduler = peer.make_scheduler(optimizer, 4, args)
        rates = []
        for _ in range(12):
            rates.append(optimizer.param_groups[0]["lr"])
            weight.grad = torch.ones(3)
            optimizer.step()
            scheduler.step()
        self.assertEqual(rates, [0.2 * f for f in
                                 (0.5, 1.0, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)])


class Augmentation(unittest.TestCase):
    def setUp(self):
        self.images = torch.randint(1, 256, (5, 1, 28, 28), dtype=torch.uint8)

    def crop(self, dx, dy, flip, padding=2):
        n = self.images.shape[0]
        return peer.crop_flip(self.images, torch.full((n,), dx), torch.full((n,), dy),
                              torch.full((n,), flip), padding)

    def test_offset_p_without_flip_is_the_image(self):
        for padding in (1, 2, 4):
            self.assertTrue(torch.equal(self.crop(padding, padding, False, padding), self.images))
        three = torch.rand(2, 3, 28, 28)  # channels and float pixels alike
        offset = torch.full((2,), 2)
        self.assertTrue(torch.equal(
            peer.crop_flip(three, offset, offset, torch.zeros(2, dtype=torch.bool), 2), three))

    def test_offset_p_with_flip_is_the_mirror(self):
        self.assertTrue(torch.equal(self.crop(2, 2, True), self.images.flip(3)))

    def test_offset_zero_shifts_down_right_with_zeros(self):
        out = self.crop(0, 0, False)
        self.assertTrue(torch.equal(out[:, :, 2:, 2:], self.images[:, :, :26, :26]))
        self.assertEqual(int(out[:, :, :2, :].count_nonzero()), 0)
        self.assertEqual(int(out[:, :, :, :2].count_nonzero()), 0)

    def test_random_draws_keep_shape_and_repeat_for_a_seed(self):
        draw = [peer.random_crop_flip(self.images, 2, torch.Generator().manual_seed(seed))
                for seed in (7, 7, 8)]
        self.assertEqual(draw[0].shape, self.images.shape)
        self.assertEqual(draw[0].dtype, torch.uint8)
        self.assertTrue(torch.equal(draw[0], draw[1]))
        self.assertFalse(torch.equal(draw[0], draw[2]))
        # every image is one of the 5 x 5 x 2 crops of itself
        for n in range(5):
            one = self.images[n:n + 1]
            crops = [peer.crop_flip(one, torch.tensor([dx]), torch.tensor([dy]),
                                    torch.tensor([flip]), 2)
                     for dx in range(5) for dy in range(5) for flip in (False, True)]
            self.assertTrue(any(torch.equal(draw[0][n:n + 1], c) for c in crops))


class Optimizer(unittest.TestCase):
    def test_skip_norm_bias_leaves_only_weight_matrices_decayed(self):
        model = peer.resnet18(10, 1, 4)
        args = recipe_args(weight_decay=5e-4, weight_decay_skip_norm_bias=True)
        groups = peer.make_optimizer(model, args).param_groups
        self.assertEqual(len(groups), 2)
        layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        self.assertEqual(len(layers), 21)  # 20 convolutions and the classifier
        self.assertEqual({id(p) for p in groups[0]["params"]}, {id(m.weight) for m in layers})
        self.assertEqual((groups[0]["weight_decay"], groups[1]["weight_decay"]), (5e-4, 0.0))
        self.assertEqual(len(groups[0]["params"]) + len(groups[1]["params"]),
                         len(list(model.parameters())))
        plain = peer.make_optimizer(model, recipe_args(weight_decay=5e-4)).param_groups
        self.assertEqual(len(plain), 1)

    def test_ema_copies_first_then_averages_weights_and_float_buffers(self):
        model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        averaged = peer.ema_model(model, 0.9)
        model(torch.randn(4, 2))  # running statistics move
        averaged.update_parameters(model)
        first = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            model[0].weight.add_(1.0)
        model(torch.randn(4, 2))
        averaged.update_parameters(model)
        now = model.state_dict()
        got = averaged.module.state_dict()
        lerp = hasattr(swa_utils, "get_ema_multi_avg_fn")  # torch 2.x: a foreach lerp
        d = min(0.9, 2 / 11)  # dptrain's warmed-up decay at the second update: (1 + 1) / (10 + 1)
        self.assertEqual(peer.ema_decay(0.9, 1), d)
        self.assertEqual(peer.ema_decay(0.9, 10 ** 6), 0.9)
        for key in ("0.weight", "0.bias", "1.running_mean", "1.running_var"):
            expected = d * first[key] + (1 - d) * now[key]
            if lerp:  # first + (1 - d) * (now - first): the same to float32 rounding
                torch.testing.assert_close(got[key], expected, rtol=1e-6, atol=1e-7)
            else:
                self.assertTrue(torch.equal(got[key], expected), key)
        if not lerp:
            self.assertEqual(int(got["1.num_batches_tracked"]), 2)  # copied, not averaged


class ValidationSplit(unittest.TestCase):
    def test_fixed_disjoint_and_the_asked_size(self):
        images = torch.arange(100).reshape(100, 1, 1, 1)
        labels = torch.arange(100)
        train_x, train_y, val_x, val_y = peer.split_validation(images, labels, 30)
        self.assertEqual((train_y.numel(), val_y.numel()), (70, 30))
        self.assertEqual(set(train_y.tolist()) | set(val_y.tolist()), set(range(100)))
        self.assertTrue(torch.equal(val_x.flatten(), val_y))
        torch.manual_seed(123)  # the split ignores the global seed
        self.assertTrue(torch.equal(peer.split_validation(images, labels, 30)[3], val_y))


def data_dir():
    found = next((d for d in DATA_DIRS if d and os.path.exists(
        os.path.join(d, "t10k-labels-idx1-ubyte.gz"))), None)
    if found is None:
        raise AssertionError("no Fashion-MNIST in $DPTRAIN_DATA, /usr/share/datasets/fashion-mnist "
                             "or ./data/fashion-mnist (apt-get install dataset-fashion-mnist)")
    return found


EVERY_FLAG = ["--width", "4", "--train-limit", "512", "--test-limit", "256", "--batch-size", "64",
              "--epochs", "2", "--threads", "1", "--seed", "3", "--channels-last", "--inplace",
              "--amp", "bf16", "--momentum", "0.9", "--nesterov", "--weight-decay", "5e-4",
              "--weight-decay-skip-norm-bias", "--lr-schedule", "cosine", "--warmup-epochs", "0.5",
              "--label-smoothing", "0.1", "--augment", "crop-flip", "--crop-padding", "2",
              "--clip-grad-norm", "1", "--ema", "0.9", "--val-split", "128"]


class TinyRun(unittest.TestCase):
    def run_peer(self):
        run = subprocess.run([sys.executable, os.path.join(BENCH, "recipe_peer.py"),
                              "--data-dir", data_dir()] + EVERY_FLAG,
                             capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        self.assertEqual(run.returncode, 0, run.stderr)
        return [json.loads(line) for line in run.stdout.splitlines()]

    def test_every_flag_on_two_epochs_twice_alike(self):
        first, second = self.run_peer(), self.run_peer()
        print("\n".join(json.dumps(line) for line in first), file=sys.stderr)
        self.assertEqual(len(first), 3)
        epochs, summary = first[:2], first[2]
        self.assertEqual((summary["train_images"], summary["val_images"]), (384, 128))
        self.assertEqual(summary["steps_per_epoch"], 6)  # ceil(384 / 64)
        self.assertEqual([e["epoch"] for e in epochs], [1, 2])
        self.assertEqual([e["steps"] for e in epochs], [6, 12])
        # the rate of each epoch's last step: steps 5 and 11 of T = 12, W = round(0.5 * 6) = 3
        self.assertEqual([e["lr"] for e in epochs],
                         [0.1 * 0.5 * (1 + math.cos(math.pi * (s - 3) / 9)) for s in (5, 11)])
        for e in epochs:
            self.assertEqual(e["test_acc"] * 256, round(e["test_acc"] * 256))
            self.assertEqual(e["val_acc"] * 128, round(e["val_acc"] * 128))
            self.assertGreater(e["seconds"], 0)
            self.assertGreater(e["eval_seconds"], 0)
        figures = ("test_acc", "val_acc", "test_loss", "val_loss", "train_loss", "train_acc")
        self.assertEqual([{k: e[k] for k in figures} for e in first[:2]],
                         [{k: e[k] for k in figures} for e in second[:2]])


# The stub programs of the time-to-accuracy test: each appends "<system> <seed> <argv>" to
# $TTA_LOG and gives epochs of 10 s training and 1 s evaluation, with test accuracies by seed.
ACCURACIES = {"dptrain": {0: [0.80, 0.91, 0.95], 1: [0.92, 0.93, 0.94], 2: [0.5, 0.6, 0.7]},
              "peer": {0: [0.80, 0.85, 0.91], 1: [0.80, 0.90, 0.93], 2: [0.91, 0.92, 0.93]}}
STUB = textwrap.dedent("""\
    import json, os, sys
    system, accuracies = {system!r}, {accuracies!r}
    argv = sys.argv[1:]
    seed = int(argv[argv.index("--seed") + 1])
    with open(os.environ["TTA_LOG"], "a") as log:
        log.write(json.dumps([system, seed, argv]) + "\\n")
    lines = [json.dumps({{"epoch": i + 1, "seconds": 10.0, "eval_seconds": 1.0, "test_acc": a,
                          "val_acc": a - 0.01}}) for i, a in enumerate(accuracies[str(seed)])]
    if system == "dptrain":
        with open(argv[argv.index("--metrics") + 1], "w") as f:
            f.write("\\n".join(lines) + "\\n")
    else:
        print("\\n".join(lines + [json.dumps({{"summary": True}})]))
    """)


class TimeToAccuracy(unittest.TestCase):
    def stub(self, folder, system):
        path = os.path.join(folder, system + "_stub.py")
        accuracies = {str(k): v for k, v in ACCURACIES[system].items()}
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\n" + STUB.format(system=system, accuracies=accuracies))
        os.chmod(path, 0o755)
        return path

    def test_times_medians_order_and_same_recipe_over_stubs(self):
        with tempfile.TemporaryDirectory() as folder:
            os.environ["TTA_LOG"] = os.path.join(folder, "log")
            recipe = ["--momentum", "0.9", "--nesterov", "--lr-schedule", "onecycle",
                      "--augment", "crop-flip", "--ema", "0.99", "--val-split", "5000"]
            record = tta.main(["--dptrain", self.stub(folder, "dptrain"), "--python",
                               sys.executable, "--peer-script", self.stub(folder, "peer"),
                               "--seeds", "0,1,2", "--epochs", "3", "--target", "0.91",
                               "--out", folder, "--name", "stub"] + recipe)
            with open(os.environ["TTA_LOG"]) as f:
                calls = [json.loads(line) for line in f]
            self.assertTrue(os.path.exists(os.path.join(folder, record["date"][:10] + "-stub.md")))
        self.assertEqual([(s, seed) for s, seed, _ in calls],
                         [("dptrain", 0), ("peer", 0), ("dptrain", 1), ("peer", 1),
                          ("dptrain", 2), ("peer", 2)])
        for _, _, argv in calls:  # the recipe, in the same words, to both
            self.assertEqual(argv[argv.index("--momentum"):][:len(recipe)], recipe)
        d, p = record["runs"]["dptrain"], record["runs"]["peer"]
        self.assertEqual([(r["reached"], r["epoch"], r["seconds"], r["eval_seconds"]) for r in d],
                         [(True, 2, 22.0, 2.0), (True, 1, 11.0, 1.0), (False, None, None, None)])
        self.assertEqual([(r["epoch"], r["seconds"]) for r in p], [(3, 33.0), (3, 33.0), (1, 11.0)])
        self.assertEqual([r["final_test_acc"] for r in d], [0.95, 0.94, 0.7])
        summary = record["summary"]
        self.assertEqual(summary["dptrain"]["median_seconds"], 22.0)  # of 11, 22 and never
        self.assertEqual(summary["dptrain"]["reached"], 2)
        self.assertEqual(summary["peer"]["median_seconds"], 33.0)
        self.assertEqual(summary["peer_over_dptrain"], 1.5)
        self.assertEqual(record["notes"], [])

    def test_fewer_than_three_seeds_is_refused_outside_tiny(self):
        with self.assertRaises(SystemExit):
            tta.main(["--seeds", "0,1", "--out", tempfile.gettempdir()])


if __name__ == "__main__":
    unittest.main()
