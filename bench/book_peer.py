#!/usr/bin/env python3
"""The book's training function (D2L, "Training on Multiple GPUs", concise version) on CPU: the
PyTorch side of bench/book_runs.py. Whole epochs, each one's train loss, train accuracy and test
accuracy printed as one JSON line, so dptrain's --metrics records can be set beside it.

It is the book's code, with what a CPU forces and what dptrain's spec fixes:
- the book splits each batch over GPUs with nn.DataParallel, which does nothing on CPU devices;
  --replicas 2 runs two processes under DistributedDataParallel over Gloo instead. Each replica
  normalises its own half-batch and the gradients are averaged: the book's semantics;
- --global-batch-norm (the peer of dptrain's --sync-bn: statistics over the whole global batch)
  runs one process on the whole batch, since PyTorch's SyncBatchNorm runs on CUDA only; with
  equal halves it is the same arithmetic;
- biases start at 0, as dptrain's spec says (the book leaves PyTorch's default there);
- --amp bf16 (not the book's) runs the forward pass under bf16 autocast, the loss in fp32;
- the data is the in-memory IDX files, pixels scaled to [0, 1], reshuffled every epoch; the last,
  smaller batch is kept, as the book's DataLoader does.

    /usr/bin/python3 bench/book_peer.py --width 8 --batch-size 256 --lr 0.1 --seed 0
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
from pytorch_peer import init_weights, load_set  # noqa: E402
from pytorch_resnet import resnet18  # noqa: E402


def bf16_autocast(args):
    """--amp bf16: PyTorch's AMP recipe on the CPU, the forward pass under bf16 autocast."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")


def evaluate(net, test_set, batch_size, args):
    """Test loss and accuracy over the whole test set, in eval mode (running statistics)."""
    net.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in DataLoader(test_set, batch_size=batch_size):
            with bf16_autocast(args):
                logits = net(images.float() / 255).float()
            loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(1) == labels).sum().item()
            count += labels.numel()
    net.train()
    return loss_sum / count, correct / count


def train(rank, args, port):
    replicas = args.replicas
    torch.set_num_threads(max(1, args.threads // replicas))
    torch.manual_seed(args.seed)
    if replicas > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=replicas)
    net = resnet18(10, 1, args.width)
    net.apply(init_weights)
    # DDP broadcasts rank 0's weights and, before every forward, its BatchNorm buffers: the
    # running statistics evaluated are rank 0's, as nn.DataParallel's are device 0's.
    model = nn.parallel.DistributedDataParallel(net) if replicas > 1 else net
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    train_set = load_set(args.data_dir, "train", args.train_limit)
    test_set = load_set(args.data_dir, "t10k", args.test_limit)
    per_replica = args.batch_size // replicas
    sampler = (DistributedSampler(train_set, replicas, rank, shuffle=True, seed=args.seed)
               if replicas > 1 else None)
    loader = DataLoader(train_set, batch_size=per_replica, shuffle=sampler is None,
                        sampler=sampler)
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        # Sums over this replica's examples: loss, correct predictions, examples.
        sums = torch.zeros(3, dtype=torch.float64)
        start = time.perf_counter()
        for images, labels in loader:
            x = images.float() / 255
            optimizer.zero_grad()
            with bf16_autocast(args):
                logits = model(x).float()
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                sums += torch.tensor([loss.item() * labels.numel(),
                                      (logits.argmax(1) == labels).sum().item(),
                                      labels.numel()], dtype=torch.float64)
        seconds = time.perf_counter() - start
        if replicas > 1:
            dist.all_reduce(sums)
        if rank == 0:
            test_loss, test_acc = evaluate(net, test_set, 256, args)
            print(json.dumps({"epoch": epoch + 1, "train_loss": sums[0].item() / sums[2].item(),
                              "train_acc": sums[1].item() / sums[2].item(),
                              "test_loss": test_loss, "test_acc": test_acc,
                              "seconds": seconds, "torch": torch.__version__}), flush=True)
    if replicas > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description="the book's training function on CPU")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--global-batch-norm", action="store_true",
                        help="normalise over the whole global batch: one process")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--amp", choices=["off", "bf16"], default="off",
                        help="bf16 autocast over the forward pass (the loss in fp32)")
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--test-limit", type=int, default=None)
    args = parser.parse_args()
    if args.global_batch_norm:
        args.replicas = 1
    if args.batch_size % args.replicas:
        parser.error(f"--batch-size {args.batch_size} does not split over "
                     f"{args.replicas} replicas")
    if args.replicas == 1:
        train(0, args, 0)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(args, port), nprocs=args.replicas)


if __name__ == "__main__":
    main()
