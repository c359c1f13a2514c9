#!/usr/bin/env python3
"""Writes the small seeds of fuzz/corpus/fuzz_checkpoint/: version-3 safetensors files (valid
ones with a few tiny tensors, and damaged copies) through tests/support/dptrain_safetensors.py,
and two DPTRNCKP files of versions 1 and 2, which dptrain still reads. Not real checkpoints: even
a width-1 model's is 20 KB, above scripts/fuzz.sh's -max_len of 4096 bytes.

    python3 fuzz/make_checkpoint_seeds.py   # deterministic; regression_*.dpt are kept as found
"""
import os
import struct
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "fuzz", "corpus", "fuzz_checkpoint")
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
sys.dont_write_bytecode = True
import dptrain_safetensors as st  # noqa: E402

TENSORS = [("0.weight", "F32", [2, 2], struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)),
           ("1.num_batches_tracked", "I64", [], struct.pack("<q", 5)),
           ("fc.1.bias", "F64", [1], struct.pack("<d", 0.125))]


def state(epochs_done=1, step=0):
    """64 images in batches of 32 make 2 steps an epoch; the position, the history and the sums
    agree with that (the reader checks they do)."""
    nan = float("nan")
    history = [{"epoch": e, "epochs": 10, "train_loss": 0.9, "train_acc": 0.6, "test_loss": 0.8,
                "test_acc": 0.7, "seconds": 12.5, "images_per_second": 4800.0, "steps": 2,
                "gpu_ms_per_step": nan, "tflops": 0.01, "mfu": nan,
                "peak_host_bytes": 2.5e8, "peak_device_bytes": nan}
               for e in range(1, epochs_done + 1)]
    return {"config": {"width": 4, "num_classes": 10, "in_channels": 1, "batch_size": 32,
                       "lr": 0.1, "seed": 7, "train_size": 64, "world_size": 2,
                       "train_digest": "0123456789abcdef" * 4},
            "epochs_done": epochs_done, "step_in_epoch": step,
            "global_step": epochs_done * 2 + step,
            # The sums of `step` full batches: none at an epoch's start.
            "partial_sums": {"loss_sum": 1.5 if step else 0.0, "correct": 3.0 if step else 0.0,
                             "count": 32.0 * step},
            "partial_seconds": 0.25, "history": history}


def dptrnckp(version):
    """A DPTRNCKP file of `version` (1 or 2): lib/include/dptrain/train/checkpoint.h before
    format 3, the tensors above with the codes 1, 3 and 2 (F32, I64, F64)."""
    p = struct.pack("<qqqqdQqq", 4, 10, 1, 32, 0.1, 7, 64, 2)  # width .. world_size
    if version >= 2:  # the training set's SHA-256, as hex text
        p += struct.pack("<Q", 64) + b"0123456789abcdef" * 4
    p += struct.pack("<qqq", 1, 0, 2)  # epochs_done, step_in_epoch, global_step
    p += struct.pack("<dddd", 1.5, 3.0, 8.0, 0.25)  # partial sums and seconds
    p += struct.pack("<Q", 1) + struct.pack("<qqddddddq", 1, 10, 0.9, 0.6, 0.8, 0.7, 12.5,
                                            4800.0, 235)
    p += struct.pack("<Q", len(TENSORS))
    for (name, _, dims, raw), code in zip(TENSORS, (1, 3, 2)):
        p += struct.pack("<Q", len(name)) + name.encode()
        p += struct.pack("<IQ", code, len(dims)) + b"".join(struct.pack("<q", d) for d in dims)
        p += struct.pack("<Q", len(raw)) + raw
    head = b"DPTRNCKP" + struct.pack("<IQ", version, len(p))
    crc = zlib.crc32(p) if version == 1 else zlib.crc32(head + p)  # v2's covers the header too
    return head + struct.pack("<I", crc) + p


def with_header_json(good, edit):
    """`good` with its JSON header replaced by `edit(text)` (and its length refitted)."""
    n = struct.unpack_from("<Q", good)[0]
    text = edit(good[8:8 + n].rstrip(b" "))
    return struct.pack("<Q", len(text)) + text + good[8 + n:]


def main():
    os.makedirs(HERE, exist_ok=True)
    diverged = state(epochs_done=1)
    diverged["history"][0].update(train_loss=float("inf"), test_loss=float("nan"))
    impossible = state()
    impossible["step_in_epoch"] = 5  # past the 2 steps of an epoch; the digest fits
    good = st.checkpoint(state(), TENSORS)
    files = {
        "valid_three_tensors.safetensors": good,
        "valid_empty.safetensors": st.checkpoint(state(epochs_done=0), []),
        "valid_mid_epoch.safetensors": st.checkpoint(state(step=1), TENSORS[:1]),
        "valid_model.safetensors": st.checkpoint(state(), TENSORS, kind="model"),
        "valid_diverged.safetensors": st.checkpoint(diverged, TENSORS[1:]),
        "truncated.safetensors": good[:len(good) // 2],
        "bad_digest.safetensors": good[:-1] + bytes([good[-1] ^ 1]),
        "newer_version.safetensors": st.checkpoint(state(), TENSORS, version="4"),
        "impossible_step.safetensors": st.checkpoint(impossible, TENSORS),
        "header_too_long.safetensors": struct.pack("<Q", (16 << 20) + 1) + good[8:],
        "hole_in_offsets.safetensors": with_header_json(
            good, lambda t: t.replace(b"[16,24]", b"[20,28]")),
        "overlap_in_offsets.safetensors": with_header_json(
            good, lambda t: t.replace(b"[16,24]", b"[12,20]")),
        "unknown_dtype.safetensors": with_header_json(good, lambda t: t.replace(b'"F64"',
                                                                                  b'"F8_E4M3"')),
        "valid_version_1.dpt": dptrnckp(1),
        "valid_version_2.dpt": dptrnckp(2),
    }
    assert b"[16,24]" in good  # the hole and the overlap move the third tensor's offsets
    for old in os.listdir(HERE):  # earlier seeds of this script; fuzzer finds (regression_*) stay
        if not old.startswith("regression_") and old not in files:
            os.remove(os.path.join(HERE, old))
    for name, data in files.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
