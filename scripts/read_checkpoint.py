#!/usr/bin/env python3
"""Reads a dptrain checkpoint (checkpoint-*.dpt) in Python: its configuration, position, epoch
history and a PyTorch state_dict, with the CRC-32 checked as dptrain checks it.

    python3 scripts/read_checkpoint.py ck/checkpoint-e0002-s000000.dpt            # a summary
    python3 scripts/read_checkpoint.py F --json                                   # all but tensors
    python3 scripts/read_checkpoint.py F --tensor-digests                         # name dtype shape sha256
    python3 scripts/read_checkpoint.py F --save-state-dict model.pt               # torch.save(state_dict)

The format is lib/include/dptrain/train/checkpoint.h's: little-endian, a 24-byte header (magic
"DPTRNCKP", format version, payload size, CRC-32), then the payload. Versions 1 and 2 are read.
In Python: `from read_checkpoint import read_checkpoint; c = read_checkpoint(path)`, then
`model.load_state_dict(c["state_dict"])` on the book's ResNet-18 (tests/pytorch_resnet.py).
"""
import argparse
import hashlib
import json
import struct
import sys
import zlib

MAGIC = b"DPTRNCKP"
HEADER = struct.Struct("<8sIQI")  # magic, version, payload size, CRC-32
STATS_FIELDS = ("epoch", "epochs", "train_loss", "train_acc", "test_loss", "test_acc", "seconds",
                "images_per_second", "steps")
STATS = struct.Struct("<qqddddddq")
CONFIG_FIELDS = ("width", "num_classes", "in_channels", "batch_size", "lr", "seed", "train_size",
                 "world_size")
CONFIG = struct.Struct("<qqqqdQqq")
DTYPES = {1: "float32", 2: "float64", 3: "int64", 4: "bfloat16", 5: "float16"}


class CheckpointError(Exception):
    """The file is not a checkpoint this script can read; the message says why."""


class Reader:
    def __init__(self, data, name):
        self.data, self.offset, self.name = data, 0, name

    def take(self, size):
        if size > len(self.data) - self.offset:
            raise CheckpointError(f"{self.name}: truncated at byte {self.offset}")
        piece = self.data[self.offset:self.offset + size]
        self.offset += size
        return piece

    def unpack(self, layout):
        return layout.unpack(self.take(layout.size))

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def text(self):
        return self.take(self.u64()).decode("utf-8")


def read_checkpoint(path, load_tensors=True):
    """The checkpoint at `path` as a dict; raises CheckpointError for anything else."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER.size or data[:8] != MAGIC:
        raise CheckpointError(f"{path}: not a dptrain checkpoint (no DPTRNCKP header)")
    _, version, size, crc = HEADER.unpack_from(data)
    payload = data[HEADER.size:]
    if size != len(payload):
        raise CheckpointError(f"{path}: the header promises {size} bytes, the file has {len(payload)}")
    covered = payload if version == 1 else data[:HEADER.size - 4] + payload
    if zlib.crc32(covered) != crc:
        raise CheckpointError(f"{path}: corrupt: the CRC-32 does not match")
    if version not in (1, 2):
        raise CheckpointError(f"{path}: format version {version}; this script reads 1 and 2")

    r = Reader(payload, path)
    result = {"format_version": version, "config": dict(zip(CONFIG_FIELDS, r.unpack(CONFIG)))}
    result["config"]["train_digest"] = r.text() if version >= 2 else ""
    result["epochs_done"], result["step_in_epoch"], result["global_step"] = r.unpack(
        struct.Struct("<qqq"))
    *sums, seconds = r.unpack(struct.Struct("<dddd"))
    result["partial_sums"] = {"loss_sum": sums[0], "correct": sums[1], "count": sums[2]}
    result["partial_seconds"] = seconds
    result["history"] = [dict(zip(STATS_FIELDS, r.unpack(STATS))) for _ in range(r.u64())]
    tensors = []
    for _ in range(r.u64()):
        name = r.text()
        code, rank = r.unpack(struct.Struct("<IQ"))
        if code not in DTYPES:
            raise CheckpointError(f"{path}: tensor {name} has the unknown dtype code {code}")
        dims = list(struct.unpack(f"<{rank}q", r.take(8 * rank)))
        raw = r.take(r.u64())
        tensors.append((name, DTYPES[code], dims, raw))
    if r.offset != len(payload):
        raise CheckpointError(f"{path}: {len(payload) - r.offset} stray bytes after the tensors")
    result["tensors"] = [(name, dtype, dims, raw) for name, dtype, dims, raw in tensors]
    if load_tensors:
        result["state_dict"] = state_dict(tensors)
    return result


def state_dict(tensors):
    """Named CPU tensors, as torch.frombuffer reads the raw row-major bytes."""
    import collections
    import torch
    out = collections.OrderedDict()
    for name, dtype, dims, raw in tensors:
        kind = getattr(torch, dtype)
        flat = torch.frombuffer(bytearray(raw), dtype=kind) if raw else torch.empty(0, dtype=kind)
        out[name] = flat.reshape(dims).clone()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--json", action="store_true", help="everything but the tensors, as JSON")
    parser.add_argument("--tensor-digests", action="store_true",
                        help="one line per tensor: name, dtype, shape, SHA-256 of its bytes")
    parser.add_argument("--save-state-dict", metavar="FILE", help="torch.save the state_dict")
    args = parser.parse_args()
    try:
        c = read_checkpoint(args.checkpoint, load_tensors=bool(args.save_state_dict))
    except (CheckpointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.tensor_digests:
        for name, dtype, dims, raw in c["tensors"]:
            shape = "x".join(str(d) for d in dims) or "scalar"
            print(f"{name} {dtype} {shape} {hashlib.sha256(raw).hexdigest()}")
    if args.json:
        print(json.dumps({k: v for k, v in c.items() if k not in ("tensors", "state_dict")},
                         indent=1, sort_keys=True))
    if args.save_state_dict:
        import torch
        torch.save(c["state_dict"], args.save_state_dict)
    if not (args.json or args.tensor_digests or args.save_state_dict):
        cfg = c["config"]
        print(f"{args.checkpoint}: format {c['format_version']}, width {cfg['width']}, "
              f"batch {cfg['batch_size']}, lr {cfg['lr']}, seed {cfg['seed']}, "
              f"world {cfg['world_size']}; epoch {c['epochs_done']} step {c['step_in_epoch']} "
              f"(global step {c['global_step']}); {len(c['history'])} epochs of history, "
              f"{len(c['tensors'])} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
