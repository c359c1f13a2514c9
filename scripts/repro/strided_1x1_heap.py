#!/usr/bin/env python3
"""oneDNN's strided 1x1 convolution backward, in PyTorch alone, against the same sums run as
dptrain runs them on the CPU: a subsample, then a unit-stride 1x1 convolution.

At odd batches and narrow channels, on two threads, the strided kernel writes outside its
buffers: glibc aborts ("corrupted size vs. prev_size") or the weight's gradient comes back as
garbage. The subsample-first form never enters that kernel's strided path.

    /usr/bin/python3 scripts/repro/strided_1x1_heap.py             # Debian's PyTorch 1.13
    .venv-torch/bin/python scripts/repro/strided_1x1_heap.py       # PyPI's 2.11
    ONEDNN_MAX_CPU_ISA=AVX2 ... --batches 3,31,256                 # oneDNN's AVX2 kernels

Each case runs in a child process (a corrupted heap takes the process with it); a case that
runs longer than --timeout is reported as a hang. See docs/channels-last.md.
"""
import argparse
import signal
import subprocess
import sys

CHILD = r"""
import sys, torch
batch, cin, cout, size, threads, layout, form, trials = sys.argv[1:9]
batch, cin, cout, size, threads, trials = map(int, (batch, cin, cout, size, threads, trials))
torch.manual_seed(0)
torch.set_num_threads(threads)
fmt = torch.channels_last if layout == "channels-last" else torch.contiguous_format
conv = torch.nn.Conv2d(cin, cout, kernel_size=1, stride=2).to(memory_format=fmt)
wrong = 0
for _ in range(trials):
    conv.zero_grad()
    x = torch.randn(batch, cin, size, size).contiguous(memory_format=fmt).requires_grad_()
    if form == "strided":
        y = conv(x)
    else:
        y = torch.nn.functional.conv2d(x[:, :, ::2, ::2].contiguous(memory_format=fmt),
                                       conv.weight, conv.bias)
    g = torch.randn_like(y)
    y.backward(g)
    pixels = x.detach()[:, :, ::2, ::2].double()
    want = torch.einsum("nohw,nihw->oi", g.double(), pixels)
    got = conv.weight.grad.view(cout, cin).double()
    if not torch.isfinite(got).all() or (got - want).abs().max() > 1e-3 * want.abs().max():
        wrong += 1
print("wrong" if wrong else "clean", wrong)
"""


def run_case(args, batch, shape, layout, form):
    cin, cout, size = shape
    command = [sys.executable, "-c", CHILD, str(batch), str(cin), str(cout), str(size),
               str(args.threads), layout, form, str(args.trials)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return "hang"
    if result.returncode < 0:
        return signal.Signals(-result.returncode).name
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        return "exit %d: %s" % (result.returncode, lines[-1] if lines else "")
    words = result.stdout.split()
    return "clean" if words and words[0] == "clean" else "%s of %d wrong" % (words[-1],
                                                                           args.trials)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="3,7,31,32,63,256")
    parser.add_argument("--shapes", default="2x4x28,4x8x28,8x16x14,16x32x28",
                        help="in x out channels x input size, comma separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    print("PyTorch %s, %d threads, %d trials per case" % (__import__("torch").__version__,
                                                           args.threads, args.trials))
    print("| batch | channels | size | layout | strided 1x1 | subsample, then 1x1 |")
    print("|---|---|---|---|---|---|")
    for batch in [int(b) for b in args.batches.split(",")]:
        for shape in shapes:
            for layout in ("channels-last", "contiguous"):
                native = run_case(args, batch, shape, layout, "strided")
                ours = run_case(args, batch, shape, layout, "subsample")
                print("| %d | %d to %d | %d | %s | %s | %s |" % (batch, shape[0], shape[1],
                                                               shape[2], layout, native, ours),
                      flush=True)


if __name__ == "__main__":
    main()
