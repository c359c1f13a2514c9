#!/usr/bin/env python3
"""Per-op CPU times of the tuned peer's training step (bench/pytorch_peer.py's model:
channels-last, in-place ReLUs, the same ops dptrain's model runs), from PyTorch's profiler:
eager, or under torch.compile (2.x), where Inductor's fused C++ kernels appear by name.
Random inputs, --warmup steps untimed, then --steps profiled; prints the table sorted by
self CPU time.

    /usr/bin/python3 bench/profile_peer.py
    .venv-torch/bin/python bench/profile_peer.py --compile
"""
import argparse
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "support"))
from pytorch_resnet import resnet18  # noqa: E402


FUSIBLE = ("aten::native_batch_norm", "aten::native_batch_norm_backward",
           "aten::threshold_backward", "aten::clamp_min_", "aten::add", "aten::add_")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=22)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layout = torch.channels_last
    net = resnet18(10, 1, args.width, inplace=True)
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, std=0.01)
            nn.init.zeros_(m.bias)
    net = net.to(memory_format=layout)
    model = net
    if args.compile:
        import torch._inductor.config as inductor
        inductor.cpp.enable_kernel_profile = True  # name each fused kernel in the profile
        model = torch.compile(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.rand(args.batch_size, 1, 28, 28).contiguous(memory_format=layout)
    y = torch.randint(0, 10, (args.batch_size,))

    def step():
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    with torch.autograd.profiler.profile() as profile:
        for _ in range(args.steps):
            step()
    print(f"torch {torch.__version__}, width {args.width}, batch {args.batch_size}, "
          f"{args.threads} threads, {'compiled' if args.compile else 'eager'}, "
          f"{args.steps} steps profiled")
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    # Per step, by kind: what a fused BatchNorm-ReLU-add kernel would replace, and the rest.
    convolution, fusible, other = 0.0, 0.0, 0.0
    for event in profile.key_averages():
        milliseconds = event.self_cpu_time_total / 1e3 / args.steps
        if event.key in ("aten::convolution_backward", "aten::mkldnn_convolution"):
            convolution += milliseconds
        elif "cpp_fused" in event.key or event.key in FUSIBLE:
            fusible += milliseconds
        else:
            other += milliseconds
    print(f"per step: convolutions {convolution:.1f} ms, BatchNorm/ReLU/add {fusible:.1f} ms "
          f"(eager ops, or Inductor's fused kernels), the rest {other:.1f} ms")


if __name__ == "__main__":
    main()
