#!/usr/bin/env python3
"""The figures docs/scaling.md models from, measured on this CPU for the book's full-width
ResNet-18 (11,175,818 parameters, 44.7 MB of fp32 gradients):

- the gradient buckets dptrain's reducer makes (reverse parameter order, --bucket-mb 25: the
  same rule as lib/src/parallel/reducer.cpp's assign_buckets);
- backward: when each bucket's last gradient is ready, from the start of backward (the model in
  PyTorch on the same LibTorch, hooks on every parameter), at a small per-replica batch;
- Gloo: the all-reduce time of a tensor of each bucket's size between two processes over
  loopback, one thread each;
- dptrain itself: the seconds per step of one replica and of two (one thread each, the same
  per-replica batch), whose difference is the communication that backward did not hide.

    /usr/bin/python3 bench/scaling_measure.py --dptrain build/app/dptrain

It writes bench/results/<date>-cpu-scaling.{md,json}.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
from book_runs import machine  # noqa: E402
from pytorch_peer import init_weights  # noqa: E402
from pytorch_resnet import resnet18  # noqa: E402

MIB = 1024 * 1024


def assign_buckets(sizes_bytes, limit_bytes):
    """Parameter indices per bucket, last parameter first (reducer.cpp's rule)."""
    buckets, filled = [], 0
    for k in reversed(range(len(sizes_bytes))):
        if not buckets or (filled > 0 and filled + sizes_bytes[k] > limit_bytes):
            buckets.append([])
            filled = 0
        buckets[-1].append(k)
        filled += sizes_bytes[k]
    return buckets


def forward_flops(net):
    """Multiply-adds x 2 of one image's forward pass through the convolutions and the linear
    layer (BatchNorm, ReLU and the additions are a few percent more and left out)."""
    total = [0]

    def count(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels
            total[0] += 2 * k * output.numel() // output.shape[0]
        elif isinstance(module, torch.nn.Linear):
            total[0] += 2 * module.in_features * module.out_features
    handles = [m.register_forward_hook(count) for m in net.modules()]
    with torch.no_grad():
        net(torch.zeros(1, 1, 28, 28))
    for h in handles:
        h.remove()
    return total[0]


def backward_timeline(net, buckets, batch, repeats):
    """Median seconds from the start of backward to each bucket's last gradient, and the median
    forward and backward seconds."""
    params = list(net.parameters())
    ready = {}
    for k, p in enumerate(params):
        p.register_hook(lambda g, k=k: ready.__setitem__(k, time.perf_counter()) or g)
    x = torch.rand(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    rows = []
    for r in range(repeats + 1):  # the first warms the allocator and is not counted
        net.zero_grad()
        t0 = time.perf_counter()
        loss = F.cross_entropy(net(x), y)
        t1 = time.perf_counter()
        ready.clear()
        loss.backward()
        t2 = time.perf_counter()
        if r > 0:
            rows.append((t1 - t0, t2 - t1, [max(ready[k] for k in b) - t1 for b in buckets]))
    forward = statistics.median(r[0] for r in rows)
    backward = statistics.median(r[1] for r in rows)
    bucket_ready = [statistics.median(r[2][i] for r in rows) for i in range(len(buckets))]
    return forward, backward, bucket_ready


def allreduce_worker(rank, port, sizes, repeats, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    result = []
    for numel in sizes:
        t = torch.ones(numel)
        times = []
        for r in range(repeats + 1):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            if r > 0:
                times.append(time.perf_counter() - start)
        result.append(statistics.median(times))
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def gloo_allreduce_seconds(sizes, repeats):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(allreduce_worker, args=(port, sizes, repeats, out), nprocs=2)
    return out.get()


def dptrain_seconds_per_step(args, replicas):
    steps = args.dptrain_steps
    batch = args.batch * replicas
    command = [args.dptrain, "train", "--devices", ",".join(["cpu"] * replicas), "--width", "64",
               "--batch-size", str(batch), "--epochs", "1", "--max-steps", str(steps),
               "--train-limit", str(batch * steps), "--test-limit", "16",
               "--threads", str(replicas), "--data-dir", args.data_dir]
    seconds = []
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "epoch.jsonl")
        for _ in range(args.repeats):
            subprocess.run(command + ["--metrics", metrics], check=True, capture_output=True)
            with open(metrics) as f:
                seconds.append(json.loads(f.readline())["seconds"] / steps)
    return statistics.median(seconds), seconds, command


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dptrain", default=os.path.join(HERE, "..", "build", "app", "dptrain"))
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--batch", type=int, default=16, help="examples per replica")
    parser.add_argument("--bucket-mb", type=float, default=25)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dptrain-steps", type=int, default=4)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = resnet18(10, 1, 64)
    net.apply(init_weights)
    params = list(net.parameters())
    sizes = [p.numel() * p.element_size() for p in params]
    buckets = assign_buckets(sizes, int(args.bucket_mb * MIB))
    bucket_bytes = [sum(sizes[k] for k in b) for b in buckets]
    flops = forward_flops(net)
    forward, backward, ready = backward_timeline(net, buckets, args.batch, args.repeats)
    allreduce = gloo_allreduce_seconds([b // 4 for b in bucket_bytes], args.repeats + 2)
    one, one_runs, one_command = dptrain_seconds_per_step(args, 1)
    two, two_runs, two_command = dptrain_seconds_per_step(args, 2)

    record = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(), "torch": torch.__version__,
        "command": " ".join([sys.executable] + sys.argv),
        "parameters": sum(p.numel() for p in params), "gradient_bytes": sum(sizes),
        "batch_per_replica": args.batch, "forward_flops_per_image": flops,
        "buckets": [{"bytes": nbytes, "parameters": len(b), "first": names(net, b[0]),
                     "last": names(net, b[-1]), "ready_after_backward_start_s": t,
                     "gloo_allreduce_s": a}
                    for b, nbytes, t, a in zip(buckets, bucket_bytes, ready, allreduce)],
        "forward_s": forward, "backward_s": backward,
        "dptrain": {"one_replica_s_per_step": one, "two_replicas_s_per_step": two,
                    "one_runs": one_runs, "two_runs": two_runs,
                    "commands": [one_command, two_command]},
    }
    stamp = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"{stamp}-cpu-scaling")
    with open(base + ".json", "w") as f:
        json.dump(record, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(record))
    print(open(base + ".md").read())


def names(net, k):
    return [n for n, _ in net.named_parameters()][k]


def markdown(r):
    m = r["machine"]
    lines = [f"# Buckets, backward and Gloo on this CPU, {r['date']}", "",
             f"{m['cpu']} ({'AVX-512' if m['avx512f'] else 'no AVX-512'}), {m['cores']} cores, "
             f"PyTorch {r['torch']} (Debian's, the LibTorch dptrain builds on), one thread per "
             f"replica. ResNet-18 at width 64: {r['parameters']:,} parameters, "
             f"{r['gradient_bytes'] / 1e6:.1f} MB of fp32 gradients; {r['batch_per_replica']} "
             f"examples per replica. Medians of the repeats.", "",
             f"Forward {r['forward_s']:.3f} s, backward {r['backward_s']:.3f} s. One image's "
             f"forward pass is {r['forward_flops_per_image'] / 1e9:.3f} GFLOP (convolutions and "
             f"the linear layer).", "",
             "| bucket | MiB | parameters | from | to | ready after (s of backward) | "
             "Gloo all-reduce, 2 processes (s) | GB/s (algorithm) |",
             "|---|---|---|---|---|---|---|---|"]
    for i, b in enumerate(r["buckets"]):
        lines.append(f"| {i} | {b['bytes'] / MIB:.2f} | {b['parameters']} | {b['first']} | "
                     f"{b['last']} | {b['ready_after_backward_start_s']:.3f} | "
                     f"{b['gloo_allreduce_s']:.4f} | "
                     f"{b['bytes'] / b['gloo_allreduce_s'] / 1e9:.2f} |")
    d = r["dptrain"]
    lines += ["", f"dptrain, width 64, {r['batch_per_replica']} examples per replica: one replica "
              f"{d['one_replica_s_per_step']:.3f} s/step, two replicas "
              f"{d['two_replicas_s_per_step']:.3f} s/step (runs: "
              f"{', '.join(f'{x:.3f}' for x in d['one_runs'])} and "
              f"{', '.join(f'{x:.3f}' for x in d['two_runs'])}).", "",
              f"Command: `{r['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
