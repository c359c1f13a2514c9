#!/usr/bin/env python3
"""Writes the small seed checkpoints of fuzz/corpus/fuzz_checkpoint/ in dptrain's format
(lib/include/dptrain/train/checkpoint.h): valid files with a few tiny tensors, and damaged copies.
The real checkpoints of even a width-1 model are 20 KB, above the fuzzer's input limit."""
import os
import struct
import zlib

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "fuzz_checkpoint")


def checkpoint(history, tensors, epochs_done=1, step=0, version=2):
    """A file the reader accepts: 64 images in batches of 32 make 2 steps an epoch, and the
    position, the history and the sums agree with that (the reader checks they do)."""
    p = struct.pack("<qqqqdQqq", 4, 10, 1, 32, 0.1, 7, 64, 2)  # width .. world_size
    if version >= 2:  # the training set's SHA-256, as hex text
        p += struct.pack("<Q", 64) + b"0123456789abcdef" * 4
    steps_per_epoch = 2
    # epochs_done, step_in_epoch, global_step
    p += struct.pack("<qqq", epochs_done, step, epochs_done * steps_per_epoch + step)
    p += struct.pack("<dddd", 1.5, 3.0, 8.0, 0.25)  # partial sums and seconds
    p += struct.pack("<Q", len(history))
    for e in history:
        p += struct.pack("<qqddddddq", *e)
    p += struct.pack("<Q", len(tensors))
    for name, code, dims, raw in tensors:
        p += struct.pack("<Q", len(name)) + name.encode()
        p += struct.pack("<IQ", code, len(dims)) + b"".join(struct.pack("<q", d) for d in dims)
        p += struct.pack("<Q", len(raw)) + raw
    return with_header(version, p)


def with_header(version, payload):
    """Version 1's CRC-32 covers the payload; version 2's the magic, version and size too."""
    head = b"DPTRNCKP" + struct.pack("<IQ", version, len(payload))
    crc = zlib.crc32(payload) if version == 1 else zlib.crc32(head + payload)
    return head + struct.pack("<I", crc) + payload


def main():
    os.makedirs(HERE, exist_ok=True)
    floats = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
    tensors = [("0.weight", 1, [2, 2], floats), ("1.num_batches_tracked", 3, [], struct.pack("<q", 5)),
               ("fc.1.bias", 2, [1], struct.pack("<d", 0.125))]
    history = [(1, 10, 0.9, 0.6, 0.8, 0.7, 12.5, 4800.0, 235)]
    files = {
        "valid_three_tensors.dpt": checkpoint(history, tensors),
        "valid_empty.dpt": checkpoint([], [], epochs_done=0),
        "valid_mid_epoch.dpt": checkpoint(history, tensors[:1], epochs_done=1, step=1),
        "valid_version_1.dpt": checkpoint(history, tensors, version=1),
    }
    good = files["valid_three_tensors.dpt"]
    files["truncated.dpt"] = good[: len(good) // 2]
    files["bad_crc.dpt"] = good[:-1] + bytes([good[-1] ^ 1])
    files["newer_version.dpt"] = with_header(3, good[24:])
    files["flipped_version_bit.dpt"] = good[:9] + bytes([good[9] ^ 1]) + good[10:]
    for name, data in files.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
