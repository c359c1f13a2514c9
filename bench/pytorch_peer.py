#!/usr/bin/env python3
"""The PyTorch peer of dptrain's benchmark: the same experiment written the way a PyTorch user
would write it -- the book's ResNet-18, N(0, 0.01) weights, plain SGD, softmax cross-entropy,
a DataLoader over the in-memory data set with a DistributedSampler, and DistributedDataParallel
over Gloo for several replicas (one process each). It trains a fixed number of steps and prints
one JSON line with the training images per second (the training loop only, as dptrain counts).

    /usr/bin/python3 bench/pytorch_peer.py --width 16 --replicas 1 --steps 30 --threads 2
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from pytorch_resnet import resnet18  # noqa: E402


def read_idx(path, header_bytes):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8)[header_bytes:]


def load_training_set(data_dir, limit):
    images = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"), 8)
    images = torch.from_numpy(images.reshape(-1, 1, 28, 28)[:limit].copy())
    labels = torch.from_numpy(labels[:limit].astype(np.int64))
    return TensorDataset(images, labels)


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
    net = resnet18(10, 1, args.width)
    net.apply(init_weights)
    model = nn.parallel.DistributedDataParallel(net) if args.replicas > 1 else net
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    dataset = load_training_set(args.data_dir, args.steps * args.batch_size)
    per_replica = args.batch_size // args.replicas
    sampler = (DistributedSampler(dataset, args.replicas, rank, shuffle=True, seed=args.seed)
               if args.replicas > 1 else None)
    loader = DataLoader(dataset, batch_size=per_replica, shuffle=sampler is None,
                        sampler=sampler, drop_last=True)
    model.train()
    start = time.perf_counter()
    steps = 0
    for images, labels in loader:
        x = images.float() / 255  # pixels to [0, 1], nothing else
        loss = F.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        if steps == args.steps:
            break
    seconds = time.perf_counter() - start
    if rank == 0:
        results.put({"images_per_second": steps * args.batch_size / seconds,
                     "seconds": seconds, "steps": steps, "loss": loss.item()})
    if args.replicas > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description="PyTorch peer of the dptrain benchmark")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
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
