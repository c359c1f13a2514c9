#!/usr/bin/env python3
"""Reads a dptrain checkpoint or `train --save-model` file (safetensors, format version 3) in
Python: its tensors as a PyTorch state_dict, the run state in its metadata, both checked as dptrain
checks them. Not here: writing them (lib/src/train/checkpoint.cpp), or older DPTRNCKP files.

    python3 scripts/read_checkpoint.py ck/checkpoint-e0002-s000000.safetensors   # a summary
    python3 scripts/read_checkpoint.py F --json                 # all but the tensors, as JSON
    python3 scripts/read_checkpoint.py F --tensor-digests       # name dtype shape sha256
    python3 scripts/read_checkpoint.py F --save-state-dict m.pt # torch.save(state_dict)

Plain weights need none of this: `safetensors.torch.load_file(F)` is the model's state_dict
(tests/support/pytorch_resnet.py's names). This script adds the checks: the offsets tile the data,
the "dptrain.digest" (docs/checkpoints.md) matches, and the run state ("dptrain.run_state") is one
a run can have. In Python: `from read_checkpoint import read_checkpoint; c = read_checkpoint(F)`,
then c["state_dict"], c["global_step"], c["history"], ... The tensors come from PyPI safetensors
where it is importable, else from torch.frombuffer over the same bytes.

Anything else is one line, `error: checkpoint F: why`, and exit status 1 (2 for a bad
--save-state-dict target): a path that is not a regular file (a FIFO is never waited on), a zip
archive, a DPTRNCKP file, a header or data that does not fit (checked before the data is read),
a digest that does not match, contents no run can have. With --json, a diverged run's nan or inf
loss is the string "nan" or "inf". Names from the file are shown with every byte but printable
ASCII as \\xNN. Tested by tests/integration/test_read_checkpoint.py.
"""
import argparse
import collections
import hashlib
import io
import json
import math
import os
import re
import stat
import struct
import sys
import tempfile

FORMAT_VERSION = 3
MAX_HEADER = 16 << 20  # lib/include/dptrain/core/safetensors.h: kMaxSafetensorsHeaderBytes
MAX_RANK, MAX_NAME, MAX_DIGEST, MAX_EPOCHS = 8, 4096, 128, 1000000
DTYPES = {"F32": ("float32", 4), "F64": ("float64", 8), "I64": ("int64", 8),
          "BF16": ("bfloat16", 2), "F16": ("float16", 2)}  # the dtypes a dptrain model holds
FACTS = ("width", "num_classes", "in_channels", "train_digest")  # metadata copies of config
CONFIG_INTS = ("width", "num_classes", "in_channels", "batch_size", "seed", "train_size",
               "world_size")
HISTORY_INTS = ("epoch", "epochs", "steps")
HISTORY_FIGURES = ("train_loss", "train_acc", "test_loss", "test_acc", "seconds",
                   "images_per_second", "gpu_ms_per_step", "tflops", "mfu", "peak_host_bytes",
                   "peak_device_bytes")
MAX_COUNT = 2**31 - 1  # --batch-size, the training set
# What a file may claim of the run that wrote it, as (field, its name in messages, lowest,
# highest): the command line's limits, and for the model's shape what any dptrain could build.
CONFIG_RANGES = (("width", "width", 1, 4096), ("num_classes", "the class count", 1, 65536),
                 ("in_channels", "the input channel count", 1, 65536),
                 ("batch_size", "the batch size", 1, MAX_COUNT),
                 ("train_size", "the training-set size", 1, MAX_COUNT),
                 ("world_size", "the world size", 1, 2**20), ("seed", "the seed", 0, 2**64 - 1))


class CheckpointError(Exception):
    """The file is not one this script reads; the message, one line, says why."""


def shown(text):
    """`text` (bytes, or a str such as a path) safe for a terminal: printable ASCII as is, a
    backslash doubled, every other byte as \\xNN."""
    raw = bytes(text) if isinstance(text, (bytes, bytearray, memoryview)) else os.fsencode(text)
    return "".join("\\\\" if b == 0x5C else chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}"
                   for b in raw)


def file_kind(mode):
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


# ---- The file: regular; its header checked against its size before the data is read ---------

def read_exactly(fd, size, fail):
    data = bytearray(size)
    view, done = memoryview(data), 0
    while done < size:
        n = os.readv(fd, [view[done:]])
        if n == 0:
            fail("read error: the file shrank while it was read")
        done += n
    return data


def refuse_foreign(first, fail):
    if first[:4] == b"PK\x03\x04":  # TorchScript and torch.save files are zip archives
        fail("a zip archive (TorchScript or torch.save), not a dptrain file; this reader never "
             "opens archives, because loading one runs the code it may carry")
    if first[:8] == b"DPTRNCKP":
        version = struct.unpack_from("<I", first, 8)[0] if len(first) >= 12 else "?"
        fail(f"format version {version} (DPTRNCKP), which only dptrain itself still reads; "
             "resume or eval it with dptrain, or save it again")


def read_file(path, fail):
    """(header JSON bytes, whole file): the length and the header are read and checked first,
    the data only once the header has been (parse_header, via `then`)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # before open: a FIFO's open would block
            fail(f"not a regular file ({file_kind(os.stat(path).st_mode)})")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        fail(f"cannot open: {e.strerror}")
    except ValueError:
        fail("cannot open: a NUL byte in the path")
    try:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped in after the stat
            fail(f"not a regular file ({file_kind(os.fstat(fd).st_mode)})")
        first = read_exactly(fd, min(size, 12), fail)
        refuse_foreign(first, fail)
        if size < 8:
            fail(f"truncated: {size} bytes, not even the 8 of the header's length")
        n = struct.unpack_from("<Q", first)[0]
        if n > MAX_HEADER:
            fail(f"a header of {n} bytes, more than the {MAX_HEADER} dptrain reads; not read")
        if n > size - 8:
            fail(f"truncated or corrupt: the header length says {n} bytes, the file has "
                 f"{size - 8} after it")
        os.lseek(fd, 8, os.SEEK_SET)
        header = read_exactly(fd, n, fail)
        c = parse_header(header, size - 8 - n, fail)
        limit = data_limit(c["metadata"])
        if size - 8 - n > limit:
            fail(f"{size - 8 - n} bytes of tensors, more than the model its metadata claims can "
                 f"hold (at most {limit}); not read")
        os.lseek(fd, 0, os.SEEK_SET)
        c["file"] = read_exactly(fd, size, fail)
        return c
    except OSError as e:
        fail(f"read error: {e.strerror}")
    except MemoryError:
        fail(f"cannot hold its {size} bytes in memory")
    finally:
        os.close(fd)


def data_limit(metadata):
    """The most tensor bytes a model of the claimed width, classes and channels holds, 8 bytes an
    element (lib/src/train/checkpoint.cpp's checkpoint_size_limit says where each term comes
    from); claims out of range are clamped, the run state's checks refuse them later."""
    def claim(key, high):
        text = metadata.get("dptrain." + key, "")
        return min(max(int(text), 1), high) if re.fullmatch(r"[0-9]{1,9}", text) else high
    w, k, c = claim("width", 4096), claim("num_classes", 65536), claim("in_channels", 65536)
    return 8 * (2800 * w * w + 64 * w * (16 + k + c) + 4 * k)


def unique_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"the name '{shown(next(k for k in keys if keys.count(k) > 1).encode())}'"
                         " appears twice")
    return dict(pairs)


def refuse_constant(name):
    raise ValueError(f"{name} is no JSON number (dptrain writes the string \"nan\" or \"inf\")")


def parse_json(raw, what, fail):
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys,
                          parse_constant=refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        fail(f"corrupt: {what} is not valid JSON: {shown(str(e).encode())}")


def parse_header(raw, data_size, fail):
    """The metadata and the tensors as (name, dtype, shape, begin, end) in the order of their
    data, which must tile the `data_size` bytes after the header exactly."""
    header = parse_json(raw, "the header", fail)
    if not isinstance(header, dict):
        fail("corrupt: the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        fail("no __metadata__ of strings: a safetensors file that dptrain did not write")
    entries = []
    for name, e in header.items():
        label = f"tensor '{shown(name.encode())}'"
        if (not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}
                or len(name.encode()) > MAX_NAME):
            fail(f"corrupt: {label} is not {{dtype, shape, data_offsets}}")
        dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in DTYPES:
            fail(f"corrupt: {label} has dtype {shown(json.dumps(dtype).encode())}, not one of "
                 f"{', '.join(DTYPES)}")
        if not (isinstance(shape, list) and len(shape) <= MAX_RANK and all(
                type(d) is int and d >= 0 for d in shape)):
            fail(f"corrupt: {label} has no shape of rank 0 to {MAX_RANK}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            fail(f"corrupt: {label} has no data_offsets [begin, end]")
        numel = math.prod(shape)
        if numel * DTYPES[dtype][1] != offsets[1] - offsets[0]:
            fail(f"corrupt: {label} of shape {shape} is {numel * DTYPES[dtype][1]} bytes of "
                 f"{dtype}, its data_offsets {offsets} hold {offsets[1] - offsets[0]}")
        entries.append((name, dtype, shape, *offsets))
    entries.sort(key=lambda t: (t[3], t[4]))
    at = 0
    for name, _, _, begin, end in entries:
        if begin != at:
            fail(f"corrupt: tensor '{shown(name.encode())}' starts at byte {begin}, where the one "
                 f"before it ends at {at} ({'a hole' if begin > at else 'an overlap'})")
        at = end
    if at != data_size:
        fail(f"truncated or padded: the tensors take {at} bytes, the file has {data_size} after "
             "its header")
    return {"metadata": metadata, "entries": entries, "data_offset": 8 + len(raw)}


# ---- The metadata: the version, the digest, the run state ----------------------------------

def netstring(text):
    raw = text.encode()
    return str(len(raw)).encode() + b":" + raw + b","


def digest(metadata, entries, data):
    """docs/checkpoints.md's "dptrain.digest": the content, not the JSON's spelling."""
    h = hashlib.sha256(b"dptrain safetensors digest 1\n")
    for key in sorted((k for k in metadata if k != "dptrain.digest"), key=str.encode):
        h.update(netstring(key) + netstring(metadata[key]))
    h.update(b"\n")
    for name, dtype, shape, begin, end in entries:
        h.update(b"".join(netstring(s) for s in (name, dtype, ",".join(map(str, shape)),
                                                  str(begin), str(end))))
    h.update(b"\n")
    h.update(data)
    return "sha256:" + h.hexdigest()


def figure(value, field, fail):
    """A double of the run state: a JSON number, or "nan", "inf", "-inf"."""
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if type(value) not in (int, float):
        fail(f"corrupt: the run state's {field} is not a number")
    return float(value)


def fields(obj, where, fail, ints=(), figures=(), others=()):
    """`obj` with exactly the fields `ints` (JSON integers), `figures` (doubles) and `others`
    (checked by the caller), the figures as floats."""
    if not isinstance(obj, dict) or set(obj) != {*ints, *figures, *others}:
        fail(f"corrupt: the run state's {where} does not have exactly the fields "
             f"{', '.join(ints + figures + others)}")
    for key in ints:
        if type(obj[key]) is not int:
            fail(f"corrupt: the run state's {where}.{key} is not an integer")
    return {**obj, **{k: figure(obj[k], f"{where}.{k}", fail) for k in figures}}


def run_state(metadata, fail):
    """"dptrain.run_state" as read_checkpoint's dict: exactly the fields dptrain writes."""
    state = parse_json(metadata.get("dptrain.run_state", "").encode(), "dptrain.run_state", fail)
    c = fields(state, "top level", fail, ints=("epochs_done", "step_in_epoch", "global_step"),
               figures=("partial_seconds",), others=("config", "partial_sums", "history"))
    c["config"] = fields(c["config"], "config", fail, ints=CONFIG_INTS, figures=("lr",),
                         others=("train_digest",))
    digest_text = c["config"]["train_digest"]
    if not isinstance(digest_text, str) or len(digest_text.encode()) > MAX_DIGEST:
        fail("corrupt: the run state's config.train_digest is not a digest")
    c["partial_sums"] = fields(c["partial_sums"], "partial_sums", fail,
                               figures=("loss_sum", "correct", "count"))
    if not isinstance(c["history"], list) or len(c["history"]) > MAX_EPOCHS:
        fail("corrupt: the run state's history is not a list of at most 1000000 epochs")
    c["history"] = [fields(e, f"history[{i}]", fail, ints=HISTORY_INTS, figures=HISTORY_FIGURES)
                    for i, e in enumerate(c["history"])]
    return c


def value_text(value):
    """A figure as the C++ reader's messages write it: a whole number in full, else as %g."""
    value = float(value)
    if math.isfinite(value) and value == math.trunc(value) and abs(value) < 1e18:
        return str(int(value))
    return "nan" if math.isnan(value) else "%g" % value


def check_contents(c, fail):
    """Note [A checkpoint's contents are checked, not only its CRC] in
    lib/src/train/checkpoint.cpp: a crafted file can carry a fitting digest, so every field must
    be one a run can have, in the C++ reader's order and words."""
    def impossible(field, value, why):
        fail(f"corrupt: impossible contents: {field} is {value_text(value)} ({why})")

    def at_least_zero(field, value):
        if not (math.isfinite(value) and value >= 0):
            impossible(field, value, "a finite number >= 0")

    def loss(field, value):
        if not (math.isnan(value) or value >= 0):
            impossible(field, value, "a loss: >= 0, inf or nan")

    config, done, step = c["config"], c["epochs_done"], c["step_in_epoch"]
    for key, field, low, high in CONFIG_RANGES:
        if not low <= config[key] <= high:
            impossible(field, config[key], f"dptrain writes {low} to {high}")
    if not (math.isfinite(config["lr"]) and config["lr"] > 0):
        impossible("the learning rate", config["lr"], "a finite number > 0")
    if not 0 <= done <= MAX_EPOCHS:
        impossible("the epochs done", done, f"dptrain writes 0 to {MAX_EPOCHS}")
    steps = -(-config["train_size"] // config["batch_size"])  # the last batch may be short
    shape = (f"an epoch of {config['train_size']} images in batches of {config['batch_size']} "
             f"has {steps} steps")
    if not 0 <= step < steps:
        impossible("the step in the epoch", step, shape)
    if c["global_step"] != done * steps + step:
        impossible("the global step", c["global_step"],
                   f"epoch {done} step {step} is global step {done * steps + step}; {shape}")
    sums = c["partial_sums"]
    loss("the epoch's loss sum", sums["loss_sum"])
    at_least_zero("the epoch's correct count", sums["correct"])
    at_least_zero("the epoch's example count", sums["count"])
    at_least_zero("the epoch's seconds", c["partial_seconds"])
    if sums["count"] > config["train_size"] or sums["correct"] > sums["count"]:
        impossible("the epoch's correct count", sums["correct"], f"of {value_text(sums['count'])}"
                   f" examples, from a training set of {config['train_size']}")
    if len(c["history"]) != done:
        impossible("the history's length", len(c["history"]),
                   f"it holds the finished epochs, and {done} are done")
    for index, s in enumerate(c["history"]):
        at = f"epoch {index + 1} of the history: "
        if s["epoch"] != index + 1:
            impossible(at + "its number", s["epoch"], "the epochs are numbered 1, 2, ...")
        loss(at + "train loss", s["train_loss"])
        loss(at + "test loss", s["test_loss"])
        for key in ("seconds", "images_per_second", "steps"):
            at_least_zero(at + key.replace("_", " "), s[key])
        for key in ("train_acc", "test_acc"):
            if not 0 <= s[key] <= 1:
                impossible(at + key.replace("_acc", " accuracy"), s[key], "an accuracy from 0 to 1")
        for key in HISTORY_FIGURES[6:]:  # measured where they can be, NaN elsewhere
            if not (math.isnan(s[key]) or s[key] >= 0) or math.isinf(s[key]):
                impossible(at + key.replace("_", " "), s[key], "a finite number >= 0 or nan")


def check_metadata(c, metadata, fail):
    """The human facts beside the run state must say what it says."""
    if metadata.get("dptrain.kind") not in ("checkpoint", "model"):
        fail("corrupt: dptrain.kind is neither \"checkpoint\" nor \"model\"")
    facts = [("epochs_done", c["epochs_done"])] + [(k, c["config"][k]) for k in FACTS]
    for key, value in facts:
        if metadata.get("dptrain." + key) != str(value):
            fail(f"corrupt: dptrain.{key} is not the run state's {shown(str(value).encode())}")
    if ("dptrain.test_acc" in metadata) != bool(c["history"]):
        fail("corrupt: dptrain.test_acc is there exactly when an epoch has finished")


def parse(c, fail):
    """The dict read_checkpoint returns, from read_file's; every check after the header's."""
    metadata, entries = c["metadata"], c["entries"]
    version = metadata.get("dptrain.format_version")
    if version is None:
        fail("no dptrain.format_version in its metadata: a safetensors file that dptrain did "
             "not write")
    if not re.fullmatch(r"[1-9][0-9]{0,8}", version):
        fail(f"corrupt: format version '{shown(version.encode())}'")
    if int(version) != FORMAT_VERSION:
        fail(f"format version {version}, written by a newer dptrain; this script reads version "
             f"{FORMAT_VERSION}" if int(version) > FORMAT_VERSION else
             f"format version {version} with a safetensors layout, which no dptrain writes")
    data = memoryview(c["file"])[c["data_offset"]:]
    if metadata.get("dptrain.digest") != digest(metadata, entries, data):
        fail("corrupt: dptrain.digest does not match the contents (damaged or edited)")
    result = run_state(metadata, fail)
    check_contents(result, fail)
    check_metadata(result, metadata, fail)
    result.update(format_version=FORMAT_VERSION, kind=metadata["dptrain.kind"],
                  metadata=metadata, tensors=[(name, DTYPES[dtype][0], shape,
                                               bytes(data[begin:end]))
                                              for name, dtype, shape, begin, end in entries])
    return result


def read_checkpoint(path, load_tensors=True):
    """The file at `path` as a dict (its "tensors" are (name, dtype, dims, raw bytes); with
    load_tensors, "state_dict" too, which needs torch); raises CheckpointError for anything else."""
    def fail(why):
        raise CheckpointError(f"checkpoint {shown(path)}: {why}")
    raw = read_file(path, fail)
    result = parse(raw, fail)
    if load_tensors:
        result["state_dict"] = state_dict(result["tensors"], raw["file"])
    return result


def state_dict(tensors, file=None):
    """The tensors in file order as CPU tensors: PyPI safetensors' own reader of the whole file
    where it is importable, else torch.frombuffer of each one's bytes."""
    import torch
    try:
        from safetensors.torch import load
    except ImportError:
        load = None
    if load is not None and file is not None:
        loaded = load(bytes(file))
        return collections.OrderedDict((name, loaded[name]) for name, *_ in tensors)
    return collections.OrderedDict(
        (name, torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(dims).clone()
         if raw else torch.empty(dims, dtype=getattr(torch, dtype)))
        for name, dtype, dims, raw in tensors)


# ---- Command line ----------------------------------------------------------------------------

def check_target(path):
    """dptrain's rule for its outputs: a new name or a regular file, never a FIFO, a device, a
    directory or a link to be written through. The reason, or None."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot look at it: {e.strerror}"
    return None if stat.S_ISREG(mode) else (f"is {file_kind(mode)}; read_checkpoint.py writes a "
                                            "new file or replaces a regular one, nothing else")


def save_state_dict(c, path):
    """torch.save through a temporary file beside `path` (created exclusively), fsync and
    rename: a failure leaves no half file and an older one untouched."""
    import torch
    buffer = io.BytesIO()
    torch.save(c["state_dict"], buffer)
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".sd-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(buffer.getbuffer())
            out.flush()
            os.fsync(out.fileno())
        why = check_target(path)  # again: something may have appeared there meanwhile
        if why:
            raise OSError(why)
        os.chmod(temporary, 0o644)
        os.rename(temporary, path)
    except BaseException:
        os.unlink(temporary)  # mkstemp's own name: nobody else's file
        raise


def json_figures(value):
    """`value` with every float JSON cannot hold as the string "nan", "inf" or "-inf"."""
    if isinstance(value, dict):
        return {k: json_figures(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_figures(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    return value


def output_lines(args, c):
    lines = []
    if args.tensor_digests:
        lines += [f"{shown(name.encode())} {dtype} {'x'.join(map(str, dims)) or 'scalar'} "
                  f"{hashlib.sha256(raw).hexdigest()}" for name, dtype, dims, raw in c["tensors"]]
    if args.json:
        lines.append(json.dumps(json_figures({k: v for k, v in c.items() if k != "tensors"}),
                                indent=1, sort_keys=True, allow_nan=False))
    if not (args.json or args.tensor_digests or args.save_state_dict):
        cfg = c["config"]
        lines.append(f"{shown(args.checkpoint)}: format {c['format_version']} {c['kind']}, width "
                     f"{cfg['width']}, batch {cfg['batch_size']}, lr {cfg['lr']}, seed "
                     f"{cfg['seed']}, world {cfg['world_size']}; epoch {c['epochs_done']} step "
                     f"{c['step_in_epoch']} (global step {c['global_step']}); "
                     f"{len(c['history'])} epochs of history, {len(c['tensors'])} tensors")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--json", action="store_true", help="everything but the tensors, as JSON")
    parser.add_argument("--tensor-digests", action="store_true",
                        help="one line per tensor: name, dtype, shape, SHA-256 of its bytes")
    parser.add_argument("--save-state-dict", metavar="FILE", help="torch.save the state_dict")
    args = parser.parse_args()
    target = args.save_state_dict
    if target and check_target(target):  # before reading, as dptrain checks --save-model
        print(f"error: --save-state-dict {shown(target)}: {check_target(target)}", file=sys.stderr)
        return 2
    try:
        c = read_checkpoint(args.checkpoint, load_tensors=bool(target))
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        sys.stdout.write("".join(line + "\n" for line in output_lines(args, c)))
        sys.stdout.flush()
    except OSError as e:  # a full device, a closed pipe: one line, not a traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"error: cannot write to standard output: {e.strerror}", file=sys.stderr)
        return 1
    try:
        if target:
            save_state_dict(c, target)
    except OSError as e:
        print(f"error: --save-state-dict {shown(target)}: cannot write: {e.strerror or e}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
