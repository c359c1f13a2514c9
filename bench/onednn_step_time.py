#!/usr/bin/env python3
"""Where one dptrain training step's time goes on the CPU: the milliseconds oneDNN's primitives
execute per step, by kind and pass (convolution forward, backward-data, backward-weights,
reorders, matmul), against the step's own wall time, in fp32 and in bf16, one replica.

oneDNN's times come from ONEDNN_VERBOSE=1 (each "exec" line ends with its milliseconds): a run
of 1 + K steps less a run of 1 step, divided by K, so that start-up, the first step's primitive
creation and the final evaluation cancel. The step's wall time comes from a run without the
verbose output (3 warm-up steps, then K timed, as bench/run_bench.py times dptrain). The rest of
a step is dptrain's and ATen's own code: BatchNorm, casts, the loss, SGD, the data.

    /usr/bin/python3 bench/onednn_step_time.py --dptrain build/app/dptrain [--steps 9]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_bench import (dptrain_command, dptrain_rate, onednn_exec_lines,  # noqa: E402
                       run_measured)


def primitive_ms(command):
    """(kind, pass) -> total milliseconds of the primitives `command` executed."""
    totals = {}
    for fields in onednn_exec_lines(command):
        stage = next((f for f in fields[3:] if f.startswith(("forward", "backward"))), "")
        key = f"{fields[2]} {stage}".strip()
        totals[key] = totals.get(key, 0.0) + float(fields[-1])
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dptrain", required=True)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=9,
                        help="timed steps, a multiple of the 3 warm-up steps (dptrain prints "
                             "its progress every 3 steps here)")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    if args.steps <= 0 or args.steps % 3:
        parser.error(f"--steps must be a positive multiple of 3, not {args.steps}")
    print(f"width {args.width}, batch {args.batch_size}, {args.threads} threads, one replica; "
          f"ms per step (1 + {args.steps} steps less 1)")
    for amp in ("off", "bf16"):
        extra = ["--amp", amp]
        one = primitive_ms(dptrain_command(args.dptrain, args, 1, 0, 1, extra))
        many = primitive_ms(dptrain_command(args.dptrain, args, 1, 1, args.steps, extra))
        per_step = {k: (many.get(k, 0) - one.get(k, 0)) / args.steps for k in set(one) | set(many)}
        _, stderr, _ = run_measured(dptrain_command(args.dptrain, args, 1, 3, args.steps, extra))
        step_ms = 1000 * args.batch_size / dptrain_rate(stderr, 3, args.steps, args.batch_size)
        onednn = sum(per_step.values())
        print(f"\n--amp {amp}: step {step_ms:.1f} ms, oneDNN {onednn:.1f} ms "
              f"({onednn / step_ms:.0%}), the rest {step_ms - onednn:.1f} ms")
        for key, ms in sorted(per_step.items(), key=lambda kv: -kv[1]):
            if ms >= 0.05:
                print(f"  {key:<36} {ms:7.1f} ms")


if __name__ == "__main__":
    main()
