#!/usr/bin/env python3
"""The upstream bug behind dptrain's CPU layout choice, in PyTorch alone (no dptrain code).

On an x86 CPU without AVX-512 (AMD EPYC up to Zen 3, for one), oneDNN runs its AVX2 kernels, and
LibTorch's channels-last convolution backward then writes past a heap block: a 1x1 stride-2
convolution from 4 to 8 channels, forward and backward on a (256, 4, 28, 28) channels-last
input, aborts with "double free or corruption". ONEDNN_MAX_CPU_ISA=AVX2 selects those kernels
on any x86 CPU, so this reproduces on Intel machines too.

    /usr/bin/python3 scripts/repro/channels_last_heap.py            # Debian's PyTorch 1.13
    .venv-torch/bin/python scripts/repro/channels_last_heap.py      # PyPI's 2.11
    ... --model --widths 1,4,8,64                                   # the book's ResNet-18
    ... --valgrind --model --widths 8 --batch 64                    # count invalid accesses

Each case runs in a child process; the table gives how it ended
(a signal such as SIGABRT is the heap corruption caught by glibc) and, under --valgrind,
memcheck's count of invalid writes. See docs/channels-last.md.
"""
import argparse
import os
import re
import signal
import subprocess
import sys

CHILD = r"""
import sys, torch
width, batch, layout, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
torch.manual_seed(0)
torch.set_num_threads(1)
fmt = torch.channels_last if layout == "channels-last" else torch.contiguous_format
if model:
    sys.path.insert(0, sys.argv[5])
    from pytorch_resnet import resnet18
    net, channels = resnet18(10, 1, width), 1
else:
    net, channels = torch.nn.Conv2d(4, 8, kernel_size=1, stride=2), 4
net = net.to(memory_format=fmt)
x = torch.rand(batch, channels, 28, 28).contiguous(memory_format=fmt).requires_grad_(not model)
for _ in range(2):
    net.zero_grad()
    net(x).float().sum().backward()
print("clean")
"""


def run_case(args, cap, layout, width):
    env = dict(os.environ)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    env.pop("DNNL_MAX_CPU_ISA", None)
    if cap:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    tests_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests")
    command = [sys.executable, "-c", CHILD, str(width), str(args.batch), layout,
               "1" if args.model else "0", tests_dir]
    if args.valgrind:
        command = ["valgrind", "--error-limit=no", "--vex-guest-max-insns=100"] + command
    result = subprocess.run(command, env=env, capture_output=True, text=True,
                            timeout=args.timeout)
    code = result.returncode
    status = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
    if args.valgrind:
        writes = len(re.findall(r"Invalid write", result.stderr))
        status += f", {writes} invalid writes"
        if "the 'impossible' happened" in result.stderr:
            status += " (valgrind itself failed)"
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="store_true", help="the book's ResNet-18, not one conv")
    parser.add_argument("--widths", default="4", help="comma list of --width values (--model)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--valgrind", action="store_true", help="run each case under memcheck")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per case")
    args = parser.parse_args()
    import torch
    print(f"torch {torch.__version__}; CPU: {cpu_model()}")
    widths = [int(w) for w in args.widths.split(",")] if args.model else [4]
    print("| oneDNN ISA cap | layout | width | exit status |")
    print("|---|---|---|---|")
    for cap in ([None] if args.valgrind else ["AVX2", None]):
        for layout in ("channels-last", "contiguous"):
            for width in widths:
                status = run_case(args, cap, layout, width)
                label = cap or ("none (valgrind: no AVX-512)" if args.valgrind else "none")
                print(f"| {label} | {layout} | {width} | {status} |", flush=True)


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
