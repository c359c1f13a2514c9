"""A writer of dptrain's safetensors files (format version 3, docs/checkpoints.md), written from
the specification and independent of every reader, for the Python tests and the fuzz seeds
(tests/integration/test_read_checkpoint.py, fuzz/make_checkpoint_seeds.py). Not a reader, and
not what dptrain writes with: that is lib/src/train/checkpoint.cpp.
"""
import hashlib
import json
import math
import struct

SIZES = {"F32": 4, "F64": 8, "I64": 8, "BF16": 2, "F16": 2}


def netstring(text):
    raw = text.encode()
    return str(len(raw)).encode() + b":" + raw + b","


def digest(metadata, tensors):
    """The "dptrain.digest" of `metadata` (without it) and `tensors` ((name, dtype, shape, raw)
    in any order: the digest takes them sorted by name, and holds no offsets)."""
    h = hashlib.sha256(b"dptrain safetensors digest 1\n")
    for key in sorted((k for k in metadata if k != "dptrain.digest"), key=str.encode):
        h.update(netstring(key) + netstring(metadata[key]))
    h.update(b"\n")
    for name, dtype, shape, raw in sorted(tensors, key=lambda t: t[0].encode()):
        h.update(netstring(name) + netstring(dtype) + netstring(",".join(map(str, shape))))
        h.update(str(len(raw)).encode() + b":" + bytes(raw) + b",")
    return "sha256:" + h.hexdigest()


def layout(header, data, pad=True):
    """u64 N, N bytes of JSON (padded with spaces so that the data starts 8-byte aligned), data."""
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors(tensors, metadata, pad=True):
    """A file of `tensors` ((name, dtype, shape, raw bytes), in that order) with `metadata`."""
    header, at = {"__metadata__": metadata} if metadata is not None else {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    return layout(header, b"".join(raw for *_, raw in tensors), pad)


def figures(value):
    """The run state's doubles as JSON: a non-finite one as the string "nan", "inf", "-inf"."""
    if isinstance(value, dict):
        return {k: figures(v) for k, v in value.items()}
    if isinstance(value, list):
        return [figures(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    return value


def metadata_of(state, kind="checkpoint", version="3"):
    """The metadata dptrain writes for run state `state` (read_checkpoint.py's dict's shape:
    config, epochs_done, step_in_epoch, global_step, partial_sums, partial_seconds, history),
    the digest still missing."""
    config = state["config"]
    run = {key: state[key] for key in ("config", "epochs_done", "step_in_epoch", "global_step",
                                       "partial_sums", "partial_seconds", "history")}
    metadata = {"format": "pt", "dptrain.format_version": version, "dptrain.kind": kind,
                "dptrain.width": str(config["width"]),
                "dptrain.num_classes": str(config["num_classes"]),
                "dptrain.in_channels": str(config["in_channels"]),
                "dptrain.epochs_done": str(state["epochs_done"]),
                "dptrain.version": "0.0.0-test", "dptrain.libtorch": "1.13.0",
                "dptrain.train_digest": config["train_digest"],
                "dptrain.run_state": json.dumps(figures(run), separators=(",", ":"),
                                                allow_nan=False)}
    if state["history"]:
        metadata["dptrain.test_acc"] = repr(state["history"][-1]["test_acc"])
    return metadata


def checkpoint(state, tensors, kind="checkpoint", version="3", edit=None, pad=True):
    """A whole file as dptrain writes it; `edit(metadata)`, if given, changes the metadata after
    it is made and before the digest is taken (so that the file's digest still fits)."""
    metadata = metadata_of(state, kind, version)
    if edit:
        edit(metadata)
    metadata["dptrain.digest"] = digest(metadata, tensors)
    return safetensors(tensors, metadata, pad)


def epoch(i, epochs=7):
    """A finished epoch's figures, every one possible; the measured ones NaN, as on the CPU, and
    the validation figures NaN, as without --val-split."""
    nan = float("nan")
    return {"epoch": i, "epochs": epochs, "train_loss": 2.302585092994046 / i,
            "train_acc": 0.1 * i, "test_loss": 0.25, "test_acc": 0.5, "seconds": 1e-300,
            "images_per_second": 6.02e11, "steps": 8, "gpu_ms_per_step": nan, "tflops": 0.5,
            "mfu": nan, "peak_host_bytes": 123456789.0, "peak_device_bytes": nan,
            "val_loss": nan, "val_acc": nan, "eval_seconds": 0.5}


def valid_state():
    """256 images in batches of 32 are 8 steps an epoch, so epoch 2 step 3 is global step 19."""
    return {"config": {"width": 4, "num_classes": 10, "in_channels": 1, "batch_size": 32,
                       "lr": 0.05, "seed": 2**64 - 7, "train_size": 256, "world_size": 2,
                       "train_digest": "5f0c" + "d" * 60},
            "epochs_done": 2, "step_in_epoch": 3, "global_step": 19,
            "partial_sums": {"loss_sum": 6.5, "correct": 40.0, "count": 96.0},
            "partial_seconds": 0.25, "history": [epoch(1), epoch(2)]}


def valid_tensors():
    """Every dtype, a scalar and an empty tensor."""
    return [("w", "F32", [3], struct.pack("<3f", 1.5, -2.0, 3.25)),
            ("n", "I64", [], struct.pack("<q", 42)),
            ("empty", "F64", [0, 3], b""),
            ("h", "BF16", [2, 1], b"\x80\x3f\x00\x40"),  # 1.0, 2.0
            ("f", "F16", [2], struct.pack("<2e", 0.5, -1.0))]


_MODEL_TENSORS = {}


def model_tensors(width=4):
    """The tensors of the book's ResNet-18 of `width` (tests/support/pytorch_resnet.py's
    state_dict: names, dtypes and shapes), in its order, with deterministic values a run can
    have (every running variance > 0); what dptrain checks a file's tensors against."""
    if width not in _MODEL_TENSORS:
        import torch  # here: the fuzz seeds and the layout tests need no torch
        from pytorch_resnet import resnet18
        rows = []
        for i, (name, t) in enumerate(resnet18(10, 1, width).state_dict().items()):
            if t.dtype == torch.int64:
                value = torch.full(t.shape, 3 + i, dtype=torch.int64)
            else:
                value = ((torch.arange(t.numel(), dtype=torch.float32) * 37 + i) % 11 - 5) / 8
                value = value.reshape(t.shape).abs() + 0.5 if name.endswith("running_var") else \
                    value.reshape(t.shape)
            dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
            rows.append((name, dtype, list(t.shape), value.numpy().tobytes()))
        _MODEL_TENSORS[width] = rows
    return list(_MODEL_TENSORS[width])
