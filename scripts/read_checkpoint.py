#!/usr/bin/env python3
"""Reads a dptrain checkpoint (checkpoint-*.dpt, or the model file of `train --save-model`) in
Python: its configuration, position, epoch history and a PyTorch state_dict, checked as dptrain
checks it. Not here: writing checkpoints (lib/src/train/checkpoint.cpp) or unpickling anything.

    python3 scripts/read_checkpoint.py ck/checkpoint-e0002-s000000.dpt            # a summary
    python3 scripts/read_checkpoint.py F --json                                   # all but tensors
    python3 scripts/read_checkpoint.py F --tensor-digests                         # name dtype shape sha256
    python3 scripts/read_checkpoint.py F --save-state-dict model.pt               # torch.save(state_dict)

With --json, a loss that is nan or inf (a run that diverged writes such losses) is the string
"nan" or "inf": the output stays JSON.

The format is lib/include/dptrain/train/checkpoint.h's: little-endian, a 24-byte header (magic
"DPTRNCKP", format version, payload size, CRC-32), then the payload. Versions 1 and 2 are read.
In Python: `from read_checkpoint import read_checkpoint; c = read_checkpoint(path)`, then
`model.load_state_dict(c["state_dict"])` on the book's ResNet-18 (tests/support/pytorch_resnet.py).

Anything else is refused with one line, `error: checkpoint F: why`, and exit status 1 (2 for a
usage mistake): a path that is not a regular file (a FIFO is never waited on), a zip archive
(TorchScript, torch.save), a payload that differs from the header or exceeds what dptrain writes
(checked before it is read), and contents that are corrupt or impossible, as lib/src/train/checkpoint.cpp
checks them. Names from the file are shown with every byte but printable ASCII as \\xNN.
Tested by tests/integration/test_read_checkpoint.py.
"""
import argparse
import hashlib
import io
import json
import math
import os
import stat
import struct
import sys
import zlib

MAGIC = b"DPTRNCKP"
ZIP_MAGIC = b"PK\x03\x04"  # TorchScript and torch.save files are zip archives
HEADER = struct.Struct("<8sIQI")  # magic, version, payload size, CRC-32
STATS_FIELDS = ("epoch", "epochs", "train_loss", "train_acc", "test_loss", "test_acc", "seconds",
                "images_per_second", "steps")
STATS = struct.Struct("<qqddddddq")
CONFIG_FIELDS = ("width", "num_classes", "in_channels", "batch_size", "lr", "seed", "train_size",
                 "world_size")
CONFIG = struct.Struct("<qqqqdQqq")
POSITION = struct.Struct("<qqqdddd")  # epochs_done, step_in_epoch, global_step, sums, seconds
DTYPES = {1: ("float32", 4), 2: ("float64", 8), 3: ("int64", 8), 4: ("bfloat16", 2),
          5: ("float16", 2)}  # code: (name, bytes per element); the codes are the file format's

# The C++ reader's limits (lib/src/train/checkpoint.cpp), so that both refuse the same files.
MAX_PAYLOAD = 2**32 - 1  # zlib's uInt there; dptrain's checkpoints are far smaller
MAX_TENSORS = 100000
MAX_RANK = 8
MAX_NAME = 4096
MAX_DIGEST = 128  # a hex SHA-256 is 64
MAX_EPOCHS = 1000000
U64_MAX = 2**64 - 1
MAX_WIDTH = 4096
MAX_CLASSES_OR_CHANNELS = 65536
MAX_COUNT = 2**31 - 1  # --batch-size, the training set
# What a file may claim of the run that wrote it, as (field, its name in messages, lowest,
# highest): the command line's limits, and for the model's shape what any dptrain could build.
CONFIG_RANGES = (("width", "width", 1, MAX_WIDTH),
                 ("num_classes", "the class count", 1, MAX_CLASSES_OR_CHANNELS),
                 ("in_channels", "the input channel count", 1, MAX_CLASSES_OR_CHANNELS),
                 ("batch_size", "the batch size", 1, MAX_COUNT),
                 ("train_size", "the training-set size", 1, MAX_COUNT),
                 ("world_size", "the world size", 1, 2**20))


class CheckpointError(Exception):
    """The file is not a checkpoint this script can read; the message, one line, says why."""


def shown(text):
    """`text` (bytes, or a str such as a path) as it may reach a terminal: printable ASCII as is,
    a backslash doubled, every other byte as \\xNN, so that no escape sequence in a file name or
    tensor name is ever written raw."""
    raw = bytes(text) if isinstance(text, (bytes, bytearray, memoryview)) else os.fsencode(text)
    return "".join("\\\\" if b == 0x5C else chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}"
                   for b in raw)


# ---- Bounded reads ---------------------------------------------------------------------------

class Reader:
    """Little-endian reads over a buffer, every one bounds-checked, failing with the C++
    ByteReader's words and its offsets (from the start of the buffer)."""

    def __init__(self, data, name):
        self.data, self.offset, self.name = memoryview(data), 0, name

    def remaining(self):
        return len(self.data) - self.offset

    def fail(self, what, at=None):
        at = self.offset if at is None else at
        raise CheckpointError(f"checkpoint {self.name}: corrupt: {what} at byte {at}")

    def take(self, size):
        if size > self.remaining():
            raise CheckpointError(f"checkpoint {self.name}: truncated: needs {size} more bytes at "
                                  f"byte {self.offset} of {len(self.data)}")
        piece = self.data[self.offset:self.offset + size]
        self.offset += size
        return piece

    def record(self, layout):
        """Fixed-size fields in one go; where they run off the end, the first field that does is
        named, as the C++ reader, which reads field by field, names it."""
        if layout.size > self.remaining():
            for code in layout.format.lstrip("<"):
                self.take(struct.calcsize("<" + code))
        return layout.unpack(self.take(layout.size))

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def i64(self):
        return struct.unpack("<q", self.take(8))[0]

    def text(self, limit, what):
        size = self.u64()
        if size > limit:
            self.fail(f"{what} of {size} bytes")
        start = self.offset
        try:
            return bytes(self.take(size)).decode("utf-8")  # strict: no replacement characters
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8", at=start)


# ---- The file: regular, its header first, then exactly the payload it declares -------------

def file_kind(mode):
    """What a path that is not a regular file is, in the words of the C++ file_kind."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


def refuse_unless_regular(mode, name):
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"checkpoint {name}: not a regular file ({file_kind(mode)})")


def open_regular(path, name):
    """A descriptor and the size of the regular file at `path`. Nothing else is opened: a FIFO
    would block until a writer came, a device may act on being opened, a socket cannot be. The
    stat comes first for that; O_NONBLOCK and the fstat cover a path swapped in between."""
    try:
        refuse_unless_regular(os.stat(path).st_mode, name)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise CheckpointError(f"checkpoint {name}: cannot open: {e.strerror}") from None
    except ValueError:  # only from Python: no command-line argument holds a NUL
        raise CheckpointError(f"checkpoint {name}: cannot open: a NUL byte in the path") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        refuse_unless_regular(info.st_mode, name)
    return fd, info.st_size


def read_into(fd, view, name):
    """Fills `view` from `fd`; a file that ends early shrank after its fstat."""
    done = 0
    while done < len(view):
        try:
            n = os.readv(fd, [view[done:]])
        except OSError as e:
            raise CheckpointError(f"checkpoint {name}: read error: {e.strerror}") from None
        if n == 0:
            raise CheckpointError(f"checkpoint {name}: read error: the file shrank while it was "
                                  "read")
        done += n


def check_header(head, file_size, name):
    """The version, payload size and CRC of a file of `file_size` bytes that starts with `head`
    (its first 24 bytes, or all of a shorter file), refused before any payload is read when the
    size is not the file's or more than dptrain writes."""
    if bytes(head[:4]) == ZIP_MAGIC:
        raise CheckpointError(f"checkpoint {name}: a zip archive (TorchScript or torch.save; "
                              "--save-model wrote these before it wrote checkpoints), not a "
                              "dptrain checkpoint; this reader never opens archives, because "
                              "loading one runs the code it may carry")
    if bytes(head[:8]) != MAGIC:
        raise CheckpointError(f"checkpoint {name}: not a dptrain checkpoint (no DPTRNCKP header)")
    r = Reader(head, name)
    r.take(len(MAGIC))
    version, size, crc = r.u32(), r.u64(), r.u32()
    if size != file_size - HEADER.size:
        raise CheckpointError(f"checkpoint {name}: truncated or padded: the header promises {size} "
                              f"bytes of payload, the file has {file_size - HEADER.size}")
    if size > MAX_PAYLOAD:
        raise CheckpointError(f"checkpoint {name}: payload of {size} bytes is larger than dptrain "
                              "writes")
    return version, crc


def size_limit(width, num_classes, in_channels, epochs_done):
    """The most bytes a checkpoint of this model and history can take, names at their longest
    (lib/src/train/checkpoint.cpp's checkpoint_size_limit, which says where each term comes from)."""
    w = min(max(width, 1), MAX_WIDTH)
    k = min(max(num_classes, 1), MAX_CLASSES_OR_CHANNELS)
    c = min(max(in_channels, 1), MAX_CLASSES_OR_CHANNELS)
    e = min(max(epochs_done, 0), MAX_EPOCHS)
    elements = 2800 * w * w + 64 * w * (16 + k + c) + 4 * k
    per_tensor = 8 + MAX_NAME + 4 + 8 + 8 * MAX_RANK + 8
    return (CONFIG.size + 8 + MAX_DIGEST + 7 * 8 + 8 + e * STATS.size + 8 + 1000 * per_tensor
            + 8 * elements)


def check_model_size(head, size, name):
    """A file larger than the model its configuration claims can fill is refused unread, as
    the C++ reader refuses it. The history's length lies beyond the digest: the bound takes the
    longest; a damaged width only loosens it (the CRC finds the damage once the file is read)."""
    if len(head) < HEADER.size + CONFIG.size:
        return
    width, classes, channels = struct.unpack_from("<qqq", head, HEADER.size)
    limit = size_limit(width, classes, channels, MAX_EPOCHS)
    if size > limit:
        raise CheckpointError(f"checkpoint {name}: {size} bytes, more than a checkpoint of a "
                              f"width-{width} model can hold (at most {limit}); not read")


def read_file(path, name):
    """The whole file, read only once its header and configuration have been checked against
    its size."""
    fd, size = open_regular(path, name)
    try:
        head = bytearray(min(size, HEADER.size + CONFIG.size))
        read_into(fd, memoryview(head), name)
        check_header(head, size, name)
        check_model_size(head, size, name)
        data = bytearray(size)  # the size the header and the fstat agree on, at most 4 GiB
        data[:len(head)] = head
        read_into(fd, memoryview(data)[len(head):], name)
        return data
    finally:
        os.close(fd)


# ---- The payload -----------------------------------------------------------------------------

def value_text(value):
    """A figure as the C++ reader's messages write it: a whole number in full, any other as
    std::ostream writes a double (printf's %g)."""
    value = float(value)
    if math.isfinite(value) and value == math.trunc(value) and abs(value) < 1e18:
        return str(int(value))
    if math.isnan(value):
        return "-nan" if math.copysign(1, value) < 0 else "nan"
    return "%g" % value


def at_least_zero(value):
    return math.isfinite(value) and value >= 0


def a_loss(value):
    """A loss of a run that diverged may be nan or inf; a negative one no run has."""
    return math.isnan(value) or value >= 0


def check_contents(c, r):
    """Note [A checkpoint's contents are checked, not only its CRC] in lib/src/train/checkpoint.cpp:
    a crafted file can carry a fitting CRC, so every field must be one a run can have, in the
    C++ reader's order and words."""
    def impossible(field, value, why):
        r.fail(f"impossible contents: {field} is {value_text(value)} ({why})")

    config = c["config"]
    for key, field, low, high in CONFIG_RANGES:
        if not low <= config[key] <= high:
            impossible(field, config[key], f"dptrain writes {low} to {high}")
    if not (math.isfinite(config["lr"]) and config["lr"] > 0):
        impossible("the learning rate", config["lr"], "a finite number > 0")
    if not 0 <= c["epochs_done"] <= MAX_EPOCHS:
        impossible("the epochs done", c["epochs_done"], f"dptrain writes 0 to {MAX_EPOCHS}")
    check_position(c, impossible)
    check_history(c, impossible)


def check_position(c, impossible):
    """The step must lie inside the epoch that the batch and training-set sizes make, and the
    unfinished epoch's sums be a part of one."""
    config, done, step = c["config"], c["epochs_done"], c["step_in_epoch"]
    steps = -(-config["train_size"] // config["batch_size"])  # the last batch may be short
    epoch_shape = (f"an epoch of {config['train_size']} images in batches of "
                   f"{config['batch_size']} has {steps} steps")
    if not 0 <= step < steps:
        impossible("the step in the epoch", step, epoch_shape)
    if c["global_step"] != done * steps + step:
        impossible("the global step", c["global_step"], f"epoch {done} step {step} is global "
                   f"step {done * steps + step}; {epoch_shape}")
    sums = c["partial_sums"]
    if not a_loss(sums["loss_sum"]):
        impossible("the epoch's loss sum", sums["loss_sum"], "a loss: >= 0, inf or nan")
    for field, value in (("the epoch's correct count", sums["correct"]),
                         ("the epoch's example count", sums["count"]),
                         ("the epoch's seconds", c["partial_seconds"])):
        if not at_least_zero(value):
            impossible(field, value, "a finite number >= 0")
    if sums["count"] > config["train_size"] or sums["correct"] > sums["count"]:
        impossible("the epoch's correct count", sums["correct"], f"of {value_text(sums['count'])} "
                   f"examples, from a training set of {config['train_size']}")


def check_history(c, impossible):
    """Exactly the finished epochs, numbered 1, 2, ..., every figure a possible one."""
    if len(c["history"]) != c["epochs_done"]:
        impossible("the history's length", len(c["history"]),
                   f"it holds the finished epochs, and {c['epochs_done']} are done")
    for index, stats in enumerate(c["history"]):
        at = f"epoch {index + 1} of the history: "
        if stats["epoch"] != index + 1:
            impossible(at + "its number", stats["epoch"], "the epochs are numbered 1, 2, ...")
        for key, field in (("train_loss", "train loss"), ("test_loss", "test loss")):
            if not a_loss(stats[key]):
                impossible(at + field, stats[key], "a loss: >= 0, inf or nan")
        for key, field in (("seconds", "seconds"), ("images_per_second", "images per second"),
                           ("steps", "steps")):
            if not at_least_zero(stats[key]):
                impossible(at + field, stats[key], "a finite number >= 0")
        for key, field in (("train_acc", "train accuracy"), ("test_acc", "test accuracy")):
            if not 0 <= stats[key] <= 1:
                impossible(at + field, stats[key], "an accuracy from 0 to 1")


def read_history(r):
    count = r.u64()
    # Each epoch is 72 bytes: a count the file cannot hold is refused before the loop.
    if count > MAX_EPOCHS or count > r.remaining() // STATS.size:
        r.fail(f"history of {count} epochs")
    return [dict(zip(STATS_FIELDS, r.record(STATS))) for _ in range(count)]


def read_tensor(r):
    """One named tensor: name, dtype code, rank, dimensions, byte count, raw bytes. Every size
    is checked against what the file still holds before anything is taken."""
    name = r.text(MAX_NAME, "tensor name")
    label = shown(name)
    code = r.u32()
    if code not in DTYPES:
        r.fail(f"unknown dtype code in tensor {label}")
    dtype, element = DTYPES[code]
    rank = r.u64()
    if rank > MAX_RANK:
        r.fail(f"tensor {label} of rank {rank}")
    dims, numel = [], 1
    for _ in range(rank):
        size = r.i64()
        if size < 0 or numel * size > U64_MAX:  # U64_MAX: the C++ reader's element count
            r.fail(f"tensor {label} with bad dimension {size}")
        dims.append(size)
        numel *= size
    stored = r.u64()
    if numel > r.remaining() // element or stored != numel * element:
        r.fail(f"tensor {label} holds {stored} bytes, its shape {numel} elements")
    return name, dtype, dims, bytes(r.take(stored))


def read_tensors(r):
    count = r.u64()
    if count > MAX_TENSORS:
        r.fail(f"{count} tensors")
    tensors, names = [], set()
    for _ in range(count):
        tensors.append(read_tensor(r))
        if tensors[-1][0] in names:  # a state_dict would silently keep only the last one
            r.fail(f"tensor {shown(tensors[-1][0])} appears twice")
        names.add(tensors[-1][0])
    return tensors


def read_payload(r, version):
    config = dict(zip(CONFIG_FIELDS, r.record(CONFIG)))
    config["train_digest"] = r.text(MAX_DIGEST, "training-set digest") if version >= 2 else ""
    done, step, global_step, loss_sum, correct, count, seconds = r.record(POSITION)
    c = {"format_version": version, "config": config, "epochs_done": done,
         "step_in_epoch": step, "global_step": global_step,
         "partial_sums": {"loss_sum": loss_sum, "correct": correct, "count": count},
         "partial_seconds": seconds}
    c["history"] = read_history(r)
    check_contents(c, r)
    c["tensors"] = read_tensors(r)
    if r.remaining() != 0:
        r.fail(f"{r.remaining()} stray bytes after the tensors")
    return c


def parse_checkpoint(data, path):
    """The checkpoint held in the bytes `data` (a whole file; `path` names it in messages) as
    read_checkpoint's dict, without tensors; raises CheckpointError for anything else."""
    name = shown(path)
    version, crc = check_header(memoryview(data)[:HEADER.size], len(data), name)
    view = memoryview(data)
    # Version 1's CRC covers the payload alone; later versions' the header before the CRC too.
    # The CRC first: only an intact header may claim a version this script does not know.
    covered = zlib.crc32(view[:HEADER.size - 4]) if version != 1 else 0
    if zlib.crc32(view[HEADER.size:], covered) != crc:
        raise CheckpointError(f"checkpoint {name}: corrupt: the CRC-32 does not match")
    if version == 0:
        raise CheckpointError(f"checkpoint {name}: format version 0, which no dptrain writes "
                              "(corrupt or foreign)")
    if version not in (1, 2):
        raise CheckpointError(f"checkpoint {name}: format version {version}, written by a newer "
                              "dptrain; this script reads versions 1 to 2")
    r = Reader(view[HEADER.size:], name)
    try:
        return read_payload(r, version)
    except (struct.error, ValueError, OverflowError, MemoryError) as e:
        # The checks above leave none of these; should one slip through, it is still one line.
        r.fail(f"unreadable contents ({type(e).__name__}: {shown(str(e))})")


def read_checkpoint(path, load_tensors=True):
    """The checkpoint at `path` as a dict; raises CheckpointError for anything else. Its
    "tensors" are (name, dtype, dims, raw bytes); "state_dict" (with load_tensors) needs torch."""
    result = parse_checkpoint(read_file(path, shown(path)), path)
    if load_tensors:
        result["state_dict"] = state_dict(result["tensors"])
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


# ---- Writing ---------------------------------------------------------------------------------

class TargetRefused(Exception):
    """--save-state-dict names something other than a new name or a regular file."""


def check_target(path):
    """dptrain's rule for its own outputs (check_output_file): a new name or a regular file,
    never a FIFO (which would block), a device, a directory or a link to be written through."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise TargetRefused(f"cannot look at it: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise TargetRefused(f"is {file_kind(mode)}; read_checkpoint.py writes a new file or "
                            "replaces a regular one, nothing else")


def create_temporary(path):
    """A new file beside `path`, named for this process; O_EXCL|O_NOFOLLOW: nothing already
    there, a planted link included, is ever written through."""
    for attempt in range(100):
        temporary = f"{path}.{os.getpid()}-{attempt}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(temporary, flags, 0o644), temporary
        except FileExistsError:
            continue
    raise FileExistsError(17, "no free temporary name")


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n == 0:
            raise OSError(28, os.strerror(28))  # ENOSPC, as the C++ writer reads a 0
        view = view[n:]


def write_atomically(path, data):
    """`data` at `path` through a temporary file, fsync and rename: a failure (a full disk, a
    file-size limit) leaves no half file, and an older file at `path` untouched."""
    fd, temporary = create_temporary(path)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)  # on disk before the rename gives it the final name
        finally:
            os.close(fd)
        check_target(path)  # again: something may have appeared there meanwhile
        os.rename(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass  # the first failure is the one to report
        raise
    sync_directory(os.path.dirname(path) or ".")


def sync_directory(directory):
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return  # the file is in place; only the rename's durability is not promised
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_state_dict(tensors, path):
    import torch
    buffer = io.BytesIO()  # torch.save into memory; the one atomic writer puts it on disk
    torch.save(state_dict(tensors), buffer)
    write_atomically(path, buffer.getbuffer())


# ---- Command line ----------------------------------------------------------------------------

def error(message, status):
    print(f"error: {message}", file=sys.stderr)
    return status


def emit(lines):
    """Writes `lines` to standard output; True when that worked. A full device or a closed pipe
    is one error line, not a traceback when the interpreter flushes at exit."""
    try:
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
        return True
    except OSError as e:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # for the exit's flush
        error(f"cannot write to standard output: {e.strerror}", 1)
        return False


def json_figures(value):
    """`value` with every float that JSON cannot hold (the losses of a run that diverged) as the
    string "nan", "inf" or "-inf"."""
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
        for name, dtype, dims, raw in c["tensors"]:
            shape = "x".join(str(d) for d in dims) or "scalar"
            lines.append(f"{shown(name)} {dtype} {shape} {hashlib.sha256(raw).hexdigest()}")
    if args.json:
        # allow_nan=False: the output stays JSON; json_figures has turned a diverged run's losses
        # into strings, and every other figure was checked finite when read.
        lines.append(json.dumps(json_figures({k: v for k, v in c.items() if k != "tensors"}),
                                indent=1, sort_keys=True, allow_nan=False))
    if not (args.json or args.tensor_digests or args.save_state_dict):
        cfg = c["config"]
        lines.append(f"{shown(args.checkpoint)}: format {c['format_version']}, width "
                     f"{cfg['width']}, batch {cfg['batch_size']}, lr {cfg['lr']}, seed "
                     f"{cfg['seed']}, world {cfg['world_size']}; epoch {c['epochs_done']} step "
                     f"{c['step_in_epoch']} (global step {c['global_step']}); "
                     f"{len(c['history'])} epochs of history, {len(c['tensors'])} tensors")
    return lines


def save(tensors, path):
    try:
        save_state_dict(tensors, path)
    except TargetRefused as e:
        return error(f"--save-state-dict {shown(path)}: {e}", 1)
    except OSError as e:
        return error(f"--save-state-dict {shown(path)}: cannot write: {e.strerror or e}", 1)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--json", action="store_true", help="everything but the tensors, as JSON")
    parser.add_argument("--tensor-digests", action="store_true",
                        help="one line per tensor: name, dtype, shape, SHA-256 of its bytes")
    parser.add_argument("--save-state-dict", metavar="FILE", help="torch.save the state_dict")
    args = parser.parse_args()
    if args.save_state_dict:
        try:  # before the checkpoint is read, as dptrain checks --save-model before training
            check_target(args.save_state_dict)
        except TargetRefused as e:
            return error(f"--save-state-dict {shown(args.save_state_dict)}: {e}", 2)
    try:
        c = read_checkpoint(args.checkpoint, load_tensors=False)
    except CheckpointError as e:
        return error(e, 1)
    if not emit(output_lines(args, c)):
        return 1
    return save(c["tensors"], args.save_state_dict) if args.save_state_dict else 0


if __name__ == "__main__":
    sys.exit(main())
