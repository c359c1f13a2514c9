#!/usr/bin/env python3
"""Issue 28: dptrain's two replicas beside the book's code under DistributedDataParallel, step by
step, past the chaotic start. Both start from the same trained weights (a dptrain checkpoint after
--warm-epochs epochs), take the same global batches in the same order (dptrain's own order,
recomputed here from its generator), split them the same way over two replicas, and every
--every steps their weights and BatchNorm statistics are compared. Beside that gap, the noise
floor: each program against itself on other thread counts, and float32 against float64 (the peer
can run float64, dptrain's loop cannot).

    python3 bench/two_replica_trace.py --dptrain build/app/dptrain --out /tmp/trace \\
        --seed 0 --warm-epochs 2 --steps 300

What the peer mirrors of dptrain, and why (each a difference between the two programs' steps,
checked by a column of the table or by construction):
- the data: epoch e's order is dptrain's epoch_order(60000, seed, e) (SplitMix64, Fisher-Yates,
  lib/src/core/random.cpp); global batch b is order[512 b, 512 (b + 1)), the last one 96; rank r
  takes its contiguous shard (dptrain's shard_range), not DistributedSampler's interleaving;
- the loss: each rank's mean over its shard, DDP averages the gradients over the 2 ranks; dptrain
  sums gradients of (shard sum / global batch). The same gradient when the shards are equal (they
  are: 256 + 256, 48 + 48), rounded differently;
- BatchNorm buffers: DDP's broadcast_buffers (rank 0's running statistics copied to every rank
  before each forward) against dptrain's averaging at every checkpoint and epoch end. Buffers do
  not enter a training step (BatchNorm normalises with the batch's statistics in training), so the
  weights cannot depend on it: --buffers ddp and --buffers dptrain must give the same weights to
  the bit, and the buffers are compared under --buffers dptrain, which averages where dptrain does.
"""
import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from pytorch_peer import load_set  # noqa: E402
from pytorch_resnet import resnet18  # noqa: E402
from read_checkpoint import read_checkpoint  # noqa: E402
from dptrain_draws import epoch_order  # noqa: E402

TRAIN_SIZE = 60000
BATCH = 512
WORLD = 2
LR = 0.2


# ---- dptrain's shards (lib/src/data/batching.cpp); its order is tests/support/dptrain_draws.py's --

def shard_range(global_size, world_size, rank):
    base, extra = divmod(global_size, world_size)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


def batches_per_epoch(n, batch):
    return (n + batch - 1) // batch


# ---- The peer: the book's step under DDP over Gloo, given dptrain's start and batches ----------

def buffers_of(net):
    return {k: v for k, v in net.state_dict().items()
            if k.endswith("running_mean") or k.endswith("running_var")}


def average_buffers_(net):
    with torch.no_grad():
        for tensor in buffers_of(net).values():
            dist.all_reduce(tensor)
            tensor /= WORLD


def averaged_buffers(net):
    """The replicas' average, as dptrain's checkpoint holds it, without touching the replicas."""
    out = {}
    for name, tensor in buffers_of(net).items():
        copy = tensor.detach().clone()
        dist.all_reduce(copy)
        out[name] = (copy / WORLD).to(torch.float64)
    return out


def peer_rank(rank, args, port, start_path, out_path):
    torch.set_num_threads(args.peer_threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    dtype = torch.float64 if args.peer_dtype == "float64" else torch.float32
    net = resnet18(10, 1, args.width)
    state = read_checkpoint(start_path)
    missing, unexpected = net.load_state_dict(state["state_dict"], strict=False)
    if unexpected or any(not k.endswith("num_batches_tracked") for k in missing):
        raise SystemExit(f"the start's names do not match the peer's: {missing} {unexpected}")
    net = net.to(dtype)
    model = nn.parallel.DistributedDataParallel(net, broadcast_buffers=args.buffers == "ddp")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    train = load_set(args.data_dir, "train", None)
    images, labels = train.tensors
    epoch, step, global_step = state["epochs_done"], state["step_in_epoch"], state["global_step"]
    if step != 0:
        raise SystemExit("the start must be at an epoch's end")
    per_epoch = batches_per_epoch(TRAIN_SIZE, BATCH)
    records = {}
    model.train()
    done = 0
    while done < args.peer_steps:
        order = epoch_order(TRAIN_SIZE, args.seed, epoch)
        for b in range(per_epoch):
            if done == args.peer_steps:
                break
            begin, end = b * BATCH, min((b + 1) * BATCH, TRAIN_SIZE)
            lo, hi = shard_range(end - begin, WORLD, rank)
            index = order[begin + lo:begin + hi]
            x = images[index].to(dtype) / 255
            y = labels[index]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            done += 1
            global_step += 1
            at_epoch_end = b == per_epoch - 1
            # dptrain averages the replicas' buffers at each checkpoint and at the epoch's end.
            if args.buffers == "dptrain" and (global_step % args.every == 0 or at_epoch_end):
                average_buffers_(net)
            if done % args.every == 0:
                buffers = averaged_buffers(net)
                if rank == 0:
                    weights = {k: v.detach().to(torch.float64).clone()
                               for k, v in net.named_parameters()}
                    records[done] = {"weights": weights, "buffers": buffers,
                                     "loss": loss.item()}
        epoch += 1
    if rank == 0:
        torch.save(records, out_path)
    dist.barrier()
    # Leave without tearing down: 1.13's DDP Reducer, destroyed while this thread holds the GIL,
    # joins a Gloo worker that waits for the GIL to free a tensor (a deadlock seen here with two
    # threads per rank). Everything this rank owes is written.
    sys.stdout.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_peer(args, start_path, out_path):
    if os.path.exists(out_path):
        return
    port = free_port()
    began = time.perf_counter()
    mp.spawn(peer_rank, args=(args, port, start_path, out_path + ".part"), nprocs=WORLD)
    os.replace(out_path + ".part", out_path)
    print(f"trace: peer {os.path.basename(out_path)} in {time.perf_counter() - began:.0f} s",
          flush=True)


# ---- dptrain: the same steps, resumed from the start, a checkpoint every --every steps ---------

def dptrain_common(args):
    return ["--devices", "cpu,cpu", "--width", str(args.width), "--batch-size", str(BATCH),
            "--lr", str(LR), "--seed", str(args.seed), "--data-dir", args.data_dir, "--quiet"]


def make_start(args):
    start_dir = os.path.join(args.out, f"start-seed{args.seed}-warm{args.warm_epochs}")
    name = f"checkpoint-e{args.warm_epochs:04d}-s000000.safetensors"
    path = os.path.join(start_dir, name)
    if not os.path.exists(path):
        subprocess.run([args.dptrain, "train", *dptrain_common(args), "--threads", "2",
                        "--epochs", str(args.warm_epochs), "--checkpoint-dir", start_dir],
                       check=True)
    return path


def run_dptrain(args, start_path, processes, out_path):
    """dptrain's states after every --every steps: {step: {"weights", "buffers"}}. processes=1:
    its two replicas in one process, one thread each (--threads 2 is the process's); processes=2:
    one replica per process as under torchrun, two threads each: the same arithmetic, other
    kernel splits, other rounding."""
    if os.path.exists(out_path):
        return
    work = out_path + ".dir"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    shutil.copy(start_path, work)
    start = read_checkpoint(start_path, load_tensors=False)
    first = start["global_step"]
    per_epoch = batches_per_epoch(TRAIN_SIZE, BATCH)
    epochs = start["epochs_done"] + math.ceil(args.steps / per_epoch) + 1
    command = [args.dptrain, "train", *dptrain_common(args), "--threads", "2",
               "--epochs", str(epochs), "--checkpoint-dir", work, "--resume",
               "--checkpoint-every-steps", str(args.every), "--test-limit", "512",
               "--max-steps", str(first + args.steps)]
    began = time.perf_counter()
    if processes == 1:
        subprocess.run(command, check=True)
    else:
        # The launcher's environment, set by hand: each process one rank on a single "cpu".
        command[command.index("cpu,cpu")] = "cpu"
        port = str(free_port())
        ranks = [subprocess.Popen(command, env={**os.environ, "MASTER_ADDR": "127.0.0.1",
                                                "MASTER_PORT": port, "WORLD_SIZE": "2",
                                                "RANK": str(r), "LOCAL_RANK": str(r),
                                                "LOCAL_WORLD_SIZE": "2"})
                 for r in range(2)]
        codes = [rank.wait() for rank in ranks]
        if any(codes):
            raise SystemExit(f"dptrain's two processes exited {codes}")
    seconds = time.perf_counter() - began
    records = {}
    # Only the checkpoints: the directory also holds dptrain's lock file.
    for name in sorted(n for n in os.listdir(work)
                       if re.fullmatch(r"checkpoint-.*\.safetensors", n)):
        checkpoint = read_checkpoint(os.path.join(work, name))
        done = checkpoint["global_step"] - first
        if done <= 0 or done % args.every:
            continue
        tensors = checkpoint["state_dict"]
        records[done] = {
            "weights": {k: v.to(torch.float64) for k, v in tensors.items()
                        if not (k.endswith("running_mean") or k.endswith("running_var")
                                or k.endswith("num_batches_tracked"))},
            "buffers": {k: v.to(torch.float64) for k, v in tensors.items()
                        if k.endswith("running_mean") or k.endswith("running_var")}}
    torch.save(records, out_path)
    shutil.rmtree(work)
    print(f"trace: dptrain {os.path.basename(out_path)} in {seconds:.0f} s", flush=True)


# ---- The gap ----------------------------------------------------------------------------------

def gap(a, b):
    """Relative L2 distance ||a - b|| / ||b|| over all tensors of a group, and the largest |a - b|."""
    keys = sorted(b)
    if sorted(a) != keys:
        raise SystemExit(f"the two sides name different tensors: {sorted(set(a) ^ set(b))[:4]}")
    diff = torch.cat([(a[k] - b[k]).flatten() for k in keys])
    ref = torch.cat([b[k].flatten() for k in keys])
    return (diff.norm() / ref.norm()).item(), diff.abs().max().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dptrain", required=True)
    parser.add_argument("--out", required=True, help="directory for the start and the traces")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=1, help="steps between comparisons")
    parser.add_argument("--show", default="1,2,5,10,20,50,100,118,119,150,200,236,237,300",
                        help="steps shown in the table")
    parser.add_argument("--float64-steps", type=int, default=120,
                        help="steps of the float64 peer, some 15 times slower than float32 "
                             "(the default passes the first epoch's end)")
    parser.add_argument("--json", help="write the table's numbers here too")
    # Internal: what one peer run is.
    parser.add_argument("--peer-dtype", default="float32")
    parser.add_argument("--peer-threads", type=int, default=1)
    parser.add_argument("--peer-steps", type=int, default=0)
    parser.add_argument("--buffers", default="dptrain", choices=("dptrain", "ddp"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    start = make_start(args)

    def trace(name, steps=args.steps):
        tag = f"seed{args.seed}-warm{args.warm_epochs}-steps{steps}-every{args.every}"
        return os.path.join(args.out, f"{name}-{tag}.pt")

    # dptrain's --threads is the process's, shared by its two replicas: on two cores one thread
    # per replica is all one process allows, so its own floor is two processes of two threads.
    # (Channels-last would be another floor, but dptrain refuses it on a CPU without AVX-512.)
    run_dptrain(args, start, 1, trace("dptrain"))
    run_dptrain(args, start, 2, trace("dptrain-2proc-threads2"))
    float64_steps = min(args.steps, args.float64_steps)
    peers = {"peer-float32-threads1": ("float32", 1, "dptrain", args.steps),
             "peer-float32-threads2": ("float32", 2, "dptrain", args.steps),
             "peer-float32-threads1-ddpbuffers": ("float32", 1, "ddp", args.steps),
             "peer-float64-threads1": ("float64", 1, "dptrain", float64_steps)}
    for name, (dtype, threads, buffers, steps) in peers.items():
        args.peer_dtype, args.peer_threads, args.buffers, args.peer_steps = \
            dtype, threads, buffers, steps
        run_peer(args, start, trace(name, steps))
    runs = {"dptrain": torch.load(trace("dptrain")),
            "dptrain-2proc-threads2": torch.load(trace("dptrain-2proc-threads2"))}
    runs.update({name: torch.load(trace(name, peer[3])) for name, peer in peers.items()})
    columns = [  # (heading, one side, the other)
        ("dptrain vs peer", "dptrain", "peer-float32-threads1"),
        ("dptrain 1 vs 2 threads/replica", "dptrain", "dptrain-2proc-threads2"),
        ("peer 1 vs 2 threads/rank", "peer-float32-threads1", "peer-float32-threads2"),
        ("peer float32 vs float64", "peer-float32-threads1", "peer-float64-threads1"),
        ("dptrain vs peer float64", "dptrain", "peer-float64-threads1"),
    ]
    show = [s for s in (int(t) for t in args.show.split(",")) if s in runs["dptrain"]]
    table = {"start": os.path.basename(start), "seed": args.seed,
             "columns": [c[0] for c in columns], "rows": [], "ratio_to_floor": {}}

    def gap_at(step, group, a, b):  # None where a run stopped earlier (the float64 peer)
        if step not in runs[a] or step not in runs[b]:
            return None
        return gap(runs[a][step][group], runs[b][step][group])

    for group in ("weights", "buffers"):
        print(f"\n{group}: relative L2 gap ||a - b|| / ||b||\n")
        print("| step | " + " | ".join(c[0] for c in columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for s in show:
            cells = [gap_at(s, group, a, b) for _, a, b in columns]
            table["rows"].append({"group": group, "step": s,
                                  "gaps": {c[0]: g for c, g in zip(columns, cells)}})
            print(f"| {s} | " + " | ".join("—" if g is None else f"{g[0]:.2e}" for g in cells)
                  + " |")
        # Over every step, not only the shown ones: the gap between the programs against the
        # gap of one program with itself on other threads.
        ratios = sorted(gap_at(s, group, "dptrain", "peer-float32-threads1")[0] /
                        gap_at(s, group, "peer-float32-threads1", "peer-float32-threads2")[0]
                        for s in runs["dptrain"]
                        if gap_at(s, group, "peer-float32-threads1", "peer-float32-threads2")[0])
        if ratios:
            summary = {"steps": len(ratios), "median": ratios[len(ratios) // 2],
                       "min": ratios[0], "max": ratios[-1]}
            table["ratio_to_floor"][group] = summary
            print(f"\n{group}: (dptrain vs peer) / (peer 1 vs 2 threads) over {len(ratios)} "
                  f"steps: median {summary['median']:.3g}, min {summary['min']:.3g}, "
                  f"max {summary['max']:.3g}")
    ddp = runs["peer-float32-threads1-ddpbuffers"]
    same = all(torch.equal(ddp[s]["weights"][k], runs["peer-float32-threads1"][s]["weights"][k])
               for s in ddp for k in ddp[s]["weights"])
    print(f"\nweights with DDP's buffer broadcast and with dptrain's averaging: "
          f"{'identical to the bit' if same else 'DIFFERENT'} over {len(ddp)} steps")
    table["ddp_buffer_broadcast_changes_weights"] = not same
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
