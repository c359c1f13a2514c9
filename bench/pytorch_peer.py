#!/usr/bin/env python3
"""The PyTorch peer of dptrain's benchmark: the same experiment written the way a PyTorch user
would write it -- the book's ResNet-18, N(0, 0.01) weights, plain SGD, softmax cross-entropy,
a DataLoader over the in-memory data set with a DistributedSampler, and DistributedDataParallel
over Gloo for several replicas (one process each).

Two ways to run it:
  --steps N    (the CPU bench, run_bench.py) trains N steps and prints one JSON line with the
               training images per second (the training loop only, as dptrain counts);
  --epochs N   (the GPU check, gpu_check.sh) trains N whole epochs as the book's train function
               does, timing each epoch's training with the device synchronised and evaluating
               after it; it prints one JSON line per epoch and a last one with the median seconds
               of epochs 2..N.
--device cuda runs on the first GPU; --channels-last, --amp bf16, --cudnn-benchmark and
--gpu-data are the usual tuning (the book uses none of them). With --steps, --channels-last,
--inplace and --compile make the tuned peers of the CPU bench, and --warmup N steps run before
the clock starts.

    /usr/bin/python3 bench/pytorch_peer.py --width 16 --replicas 1 --steps 30 --threads 2
    python3 bench/pytorch_peer.py --device cuda --epochs 10 --channels-last --amp bf16
"""
import argparse
import gzip
import json
import os
import sys
import time

import statistics

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "support"))
from pytorch_resnet import resnet18  # noqa: E402


def read_idx(path, header_bytes):
    with gzip.open(path) as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)[header_bytes:]


def load_set(data_dir, prefix, limit):
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"), 8)
    images = images.reshape(-1, 1, 28, 28)[:limit].clone()
    labels = labels[:limit].to(torch.int64)
    return TensorDataset(images, labels)


def load_training_set(data_dir, limit):
    return load_set(data_dir, "train", limit)


def init_weights(module):
    # The book's initialisation: weights ~ N(0, 0.01), biases 0 (BatchNorm keeps gamma 1, beta 0).
    if isinstance(module, (nn.Conv2d, nn.Linear)):
        nn.init.normal_(module.weight, std=0.01)
        nn.init.zeros_(module.bias)


def run(rank, args, port, results):
    torch.set_num_threads(max(1, args.threads // args.replicas))
    torch.manual_seed(args.seed)
    if args.replicas > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=args.replicas)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    net = resnet18(10, 1, args.width, inplace=args.inplace)
    net.apply(init_weights)
    net = net.to(memory_format=memory_format)
    model = nn.parallel.DistributedDataParallel(net) if args.replicas > 1 else net
    if args.compile:  # the DDP-wrapped module, so that Dynamo splits its graph at the buckets
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    dataset = load_training_set(args.data_dir, (args.warmup + args.steps) * args.batch_size)
    per_replica = args.batch_size // args.replicas
    sampler = (DistributedSampler(dataset, args.replicas, rank, shuffle=True, seed=args.seed)
               if args.replicas > 1 else None)
    loader = DataLoader(dataset, batch_size=per_replica, shuffle=sampler is None,
                        sampler=sampler, drop_last=True)
    model.train()
    # The clock starts after --warmup steps (oneDNN's primitives, torch.compile's compilation)
    # and stops after --steps more, as bench/run_bench.py times dptrain.
    begin = time.perf_counter()
    start, steps = begin, 0
    for images, labels in loader:
        x = (images.float() / 255).contiguous(memory_format=memory_format)  # pixels to [0, 1]
        # --amp bf16 as PyTorch's AMP recipe writes it: the forward pass under autocast, the
        # loss in fp32.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        if steps == args.warmup:
            start = time.perf_counter()
        if steps == args.warmup + args.steps:
            break
    seconds = time.perf_counter() - start
    if rank == 0:
        timed = steps - args.warmup
        results.put({"images_per_second": timed * args.batch_size / seconds,
                     "seconds": seconds, "steps": timed, "warmup_seconds": start - begin,
                     "loss": loss.item(), "torch": torch.__version__})
    if args.replicas > 1:
        dist.destroy_process_group()


def evaluate(net, test_set, device, batch_size, memory_format, amp):
    net.eval()
    correct, count = 0, 0
    with torch.no_grad():
        for images, labels in DataLoader(test_set, batch_size=batch_size):
            x = (images.to(device).float() / 255).contiguous(memory_format=memory_format)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = net(x)
            correct += (logits.argmax(1) == labels.to(device)).sum().item()
            count += labels.numel()
    net.train()
    return correct / max(count, 1)


def run_epochs(args):
    """The book's train function on one device: whole epochs, each timed and evaluated."""
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    amp = args.amp == "bf16"
    net = resnet18(10, 1, args.width)
    net.apply(init_weights)
    net = net.to(device, memory_format=memory_format)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    train_set = load_set(args.data_dir, "train", args.train_limit)
    test_set = load_set(args.data_dir, "t10k", args.test_limit)
    if args.gpu_data:  # the whole set on the device once; batches are index gathers there
        images, labels = (t.to(device) for t in train_set.tensors)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    seconds = []
    for epoch in range(args.epochs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        if args.gpu_data:
            order = torch.randperm(images.shape[0], device=device)
            batches = ((images[order[i:i + args.batch_size]], labels[order[i:i + args.batch_size]])
                       for i in range(0, images.shape[0], args.batch_size))
        else:
            batches = loader
        for x_bytes, y in batches:
            x = (x_bytes.to(device, non_blocking=True).float() / 255).contiguous(
                memory_format=memory_format)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = net(x)
            loss = F.cross_entropy(logits.float(), y)
            loss.backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        test_acc = evaluate(net, test_set, device, args.batch_size, memory_format, amp)
        print(json.dumps({"epoch": epoch + 1, "seconds": seconds[-1], "test_acc": test_acc,
                          "images_per_second": len(train_set) / seconds[-1]}), flush=True)
    steady = statistics.median(seconds[1:]) if len(seconds) > 1 else None
    print(json.dumps({"epochs": args.epochs, "steady_seconds": steady, "test_acc": test_acc,
                      "mean_seconds": sum(seconds) / len(seconds), "device": str(device),
                      "channels_last": args.channels_last, "amp": args.amp,
                      "gpu_data": args.gpu_data, "torch": torch.__version__}), flush=True)


def main():
    parser = argparse.ArgumentParser(description="PyTorch peer of the dptrain benchmark")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=0,
                        help="steps before the timed --steps (with --steps)")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=0,
                        help="train whole epochs, timed and evaluated (one replica), not --steps")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--test-limit", type=int, default=None)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--inplace", action="store_true",
                        help="ReLUs and the shortcut's sum in place, as dptrain (with --steps)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model, PyTorch 2.x (with --steps)")
    parser.add_argument("--amp", choices=["off", "bf16"], default="off")
    parser.add_argument("--cudnn-benchmark", action="store_true")
    parser.add_argument("--gpu-data", action="store_true",
                        help="keep the training set on the device (no DataLoader copies)")
    args = parser.parse_args()
    if args.epochs > 0:
        run_epochs(args)
        return
    results = mp.get_context("spawn").SimpleQueue()
    if args.replicas == 1:
        run(0, args, 0, results)
    else:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(run, args=(args, port, results), nprocs=args.replicas)
    print(json.dumps(results.get()))


if __name__ == "__main__":
    main()
