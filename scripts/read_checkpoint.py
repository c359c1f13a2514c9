#!/usr/bin/env python3
"""Reads a dptrain checkpoint or `train --save-model` file (safetensors, format version 3) as
dptrain reads it: the layout, the content digest and the run state checked, then the tensors as a
PyTorch state_dict. Not here: writing them (lib/src/train/checkpoint.cpp), DPTRNCKP files.

    python3 scripts/read_checkpoint.py ck/checkpoint-e0002-s000000.safetensors   # a summary
    python3 scripts/read_checkpoint.py F --json             # all but the tensors, as JSON
    python3 scripts/read_checkpoint.py F --tensor-digests   # name dtype shape sha256

The weights alone need no script: `safetensors.torch.load_file(F)` is the state_dict of
tests/support/pytorch_resnet.py's model. In Python: `from read_checkpoint import read_checkpoint`,
then `read_checkpoint(F)["state_dict"]`, ["global_step"], ["history"], ...: the tensors from PyPI
safetensors where it is importable, else torch.frombuffer; --json and --tensor-digests need
neither. A fault is one line, `error: checkpoint F: why`, exit status 1, for every file that is
not a valid one (docs/checkpoints.md, "A valid file"); a file too large for the memory left is
refused before its data is read, a FIFO never waited on; Ctrl-C is one line too, exit status 130.
With --json a diverged run's nan or inf is the string "nan" or "inf"; names from the file are
shown with every byte but printable ASCII as \\xNN. Tested by
tests/integration/test_read_checkpoint.py.
"""
import argparse
import collections
import hashlib
import json
import math
import os
import re
import resource
import stat
import struct
import sys

FORMAT_VERSION = 3
MAX_HEADER = 16 << 20  # lib/include/dptrain/core/safetensors.h: kMaxSafetensorsHeaderBytes
MAX_RANK, MAX_EPOCHS, MAX_COUNT = 8, 1000000, 2**31 - 1
# No run is older than about 31 years, nor trains 10^12 images a second (checkpoint_run_state.cpp).
MAX_SECONDS, MAX_IMAGES_PER_SECOND = 1e9, 1e12
# No device does 10^5 TFLOP/s (core/peak_tflops.h: kMaxPeakTflops), nor holds 2^50 bytes (a PiB).
MAX_PEAK_TFLOPS, MAX_BYTES = 1e5, 2**50
# A JSON number's spelling (RFC 8259): how "dptrain.test_acc" may give the run state's accuracy.
JSON_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
# The dtypes a dptrain model holds: torch's name, the element's bytes, and for a floating dtype
# its exponent bits, all set in an infinity or a NaN.
DTYPES = {"F32": ("float32", 4, 0x7F800000), "F64": ("float64", 8, 0x7FF0000000000000),
          "I64": ("int64", 8, None), "BF16": ("bfloat16", 2, 0x7F80), "F16": ("float16", 2, 0x7C00)}
# The run state's fields, each with its kind, in the order the C++ reader reads them
# (checkpoint.cpp: read_run_state); "later" are figures a later version added, NaN when absent.
CONFIG = {"width": "int", "num_classes": "int", "in_channels": "int", "batch_size": "int",
          "lr": "real", "seed": "u64", "train_size": "int", "world_size": "int",
          "train_digest": "str"}
POSITION = {"epochs_done": "int", "step_in_epoch": "int", "global_step": "int",
            "partial_sums": "any"}
SUMS = {"loss_sum": "real", "correct": "real", "count": "real"}
# config.recipe, present where the run's recipe was not the book's (train/recipe.h).
RECIPE = {"momentum": "real", "nesterov": "bool", "weight_decay": "real",
          "weight_decay_skip_norm_bias": "bool", "lr_schedule": "str", "warmup_epochs": "real",
          "lr_step_epochs": "int", "lr_step_gamma": "real", "schedule_epochs": "int",
          "label_smoothing": "real", "augment": "str", "crop_padding": "int",
          "clip_grad_norm": "real", "ema": "real"}
# The optimizer's state beside the weights: a prefix, then a tensor of the model's
# (checkpoint_types.h: kMomentumPrefix, kAveragePrefix).
STATE_PREFIXES = ("momentum.", "ema.")
# An epoch's figures: the rows of the table every writer and reader of them is made from,
# lib/include/dptrain/train/epoch_figures.def (its columns are named there).
#
# Note [The table read as text]
# This script reads the .def beside it in the repository rather than holding a copy of its rows. It
# runs from a checkout (docs/checkpoints.md, the tests), where the table always is; a copy would be
# a second place to add a figure, and a test would have to find the two disagreeing after the fact.
# The rows are one macro call a line, so a regular expression reads them whole; what the C++
# compiler accepts this reads the same.
EPOCH_FIGURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib", "include",
                             "dptrain", "train", "epoch_figures.def")


def epoch_figures(path=EPOCH_FIGURES):
    """The table's rows as dicts of its columns, in its order."""
    columns = ("name", "of", "type", "initial", "unit", "kept", "written")
    with open(path, encoding="utf-8") as f:
        return [dict(zip(columns, (cell.strip() for cell in row.split(","))))
                for row in re.findall(r"^DPTRAIN_EPOCH_FIGURE\((.*)\)\s*$", f.read(), re.M)]


# Each history epoch's figures as the run state keeps them (kept since_v1: an integer or a real
# every file has; since_v3: a real a file may lack), in the table's order, the C++ reader's.
STATS = {f["name"]: "later" if f["kept"] == "since_v3" else
         "int" if f["type"] == "int64_t" else "real"
         for f in epoch_figures() if f["kept"] != "not_kept"}
# What a file may claim of the run that wrote it, as (field, its name in messages, lowest,
# highest): the command line's limits, and for the model's shape what any dptrain could build.
CONFIG_RANGES = (("width", "width", 1, 4096), ("num_classes", "the class count", 1, 65536),
                 ("in_channels", "the input channel count", 1, 65536),
                 ("batch_size", "the batch size", 1, MAX_COUNT),
                 ("train_size", "the training-set size", 1, MAX_COUNT),
                 ("world_size", "the world size", 1, 2**20))


class CheckpointError(Exception):
    """The file is not one this script reads; the message, one line, says why."""


def shown(text):
    """`text` (bytes, or a str such as a path) safe for a terminal: printable ASCII as is, a
    backslash doubled, every other byte as \\xNN."""
    raw = bytes(text) if isinstance(text, (bytes, bytearray, memoryview)) else os.fsencode(text)
    return "".join("\\\\" if b == 0x5C else chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}"
                   for b in raw)


# ---- The file: regular; its header checked against its size before the data is read ---------

def file_kind(mode):
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


def read_exactly(fd, offset, size, fail):
    data = bytearray(size)
    done = 0
    while done < size:
        n = os.preadv(fd, [memoryview(data)[done:]], offset + done)
        if n == 0:
            fail("read error: the file shrank while it was read")
        done += n
    return data


def available_memory():
    """What this process may still allocate: MemAvailable, or what RLIMIT_AS (`ulimit -v`) still
    leaves where that is less; None where neither can be read (memory_budget.cpp's
    available_host_memory)."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            used = 0
        room = max(soft - used, 0)
        available = room if available is None else min(available, room)
    return available


def check_claimed_width(metadata, size, fail):
    """Note [A file is bounded by what the run can use, not by its own word] in accepted_model.h:
    the width the metadata claims must be one whose data this process can hold (its file at 8
    bytes an element), and the file no larger than the memory left, before the data is read."""
    text = metadata.get("dptrain.width", "")
    available = available_memory()
    if re.fullmatch(r"[0-9]{1,9}", text) and int(text) <= 4096 and available is not None:
        width = int(text)  # a wider claim is named by the run state's checks
        need = model_bytes(width, 10, 1)
        if need > available:
            fail(f"claims a model of width {width}, whose data needs about {need / 2**30:.2f} GiB,"
                 f" and {available / 2**30:.2f} GiB of memory is available; not read")
    if available is not None and size > available:
        fail(f"{size} bytes, more than the {available} bytes of memory available; not read")


def model_bytes(w, k, c):
    """8 bytes for each element of the ResNet-18 of width w, k classes, c input channels, bounded
    as checkpoint.cpp's model_elements_bound bounds it."""
    return 8 * (2800 * w * w + 64 * w * (16 + k + c) + 4 * k)


def data_limit(metadata):
    """The most tensor bytes the model its metadata claims holds, 8 an element (checkpoint.cpp's
    model_elements_bound); a claim out of range is clamped, and refused later by the run state's
    checks."""
    def claim(key, high):
        text = metadata.get("dptrain." + key, "")
        return min(max(int(text), 1), high) if re.fullmatch(r"[0-9]{1,9}", text) else high
    # The model's tensors, and as much again for each of the momentum and the averaged weights.
    return 3 * model_bytes(claim("width", 4096), claim("num_classes", 65536),
                           claim("in_channels", 65536))


def read_file(path, fail):
    """parse_header's dict and the whole file, read only once its header fits its size."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # before open: a FIFO's open would block
            fail(f"not a regular file ({file_kind(os.stat(path).st_mode)})")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        fail(f"cannot open: {e.strerror}")
    except ValueError:
        fail("cannot open: a NUL byte in the path")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # swapped in after the stat
            fail(f"not a regular file ({file_kind(info.st_mode)})")
        size, first = info.st_size, read_exactly(fd, 0, min(info.st_size, 12), fail)
        if first[:4] == b"PK\x03\x04":  # TorchScript and torch.save files are zip archives
            fail("a zip archive (TorchScript or torch.save), not a dptrain file; this reader "
                 "never opens archives, because loading one runs the code it may carry")
        if first[:8] == b"DPTRNCKP":
            version = struct.unpack_from("<I", first, 8)[0] if size >= 12 else "?"
            fail(f"format version {version} (DPTRNCKP), which only dptrain itself still reads; "
                 "resume or eval it with dptrain, or save it again")
        if size < 8:
            fail(f"truncated: {size} bytes, shorter than a safetensors file's 8-byte header "
                 "length")
        n = struct.unpack_from("<Q", first)[0]
        if n > MAX_HEADER:
            fail(f"not a safetensors file of dptrain's, or corrupt: its first 8 bytes give a "
                 f"header of {n} bytes, more than the {MAX_HEADER} dptrain reads")
        if n < 2 or n > size - 8:
            fail(f"truncated or corrupt: the header length says {n} bytes, the file has "
                 f"{size - 8} after it")
        c = parse_header(read_exactly(fd, 8, n, fail), size - 8 - n, fail)
        check_width_first(c["metadata"], fail)
        if size - 8 - n > data_limit(c["metadata"]):
            fail(f"{size - 8 - n} bytes of tensors, more than the model its metadata claims can "
                 f"hold (at most {data_limit(c['metadata'])}); not read")
        check_claimed_width(c["metadata"], size, fail)
        c["file"] = read_exactly(fd, 0, size, fail)
        return c
    except OSError as e:
        fail(f"read error: {e.strerror}")
    except MemoryError:
        fail(f"cannot hold its {size} bytes in memory")
    finally:
        os.close(fd)


def unique_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"the name '{shown(twice.encode())}' appears twice")
    return dict(pairs)


def no_constant(name):
    raise ValueError(f"{name} is no JSON number (dptrain writes the string \"nan\" or \"inf\")")


def parse_json(raw, what, fail):
    """`raw` as Note [One JSON text, one reading] in lib/src/core/safetensors.cpp reads JSON:
    one value and only whitespace after it, no NUL byte, no name twice in one object."""
    if b"\0" in raw:
        fail(f"corrupt: {what} is not valid JSON: a NUL byte at byte {bytes(raw).index(0)} of "
             f"{len(raw)}")
    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys,
                           parse_constant=no_constant)
        # An escaped lone surrogate ("\ud800") parses to a str with no UTF-8 form, which every
        # later .encode() (a digest's netstring, a message) would raise on; the C++ refuses it.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return value
    except UnicodeEncodeError as e:
        fail(f"corrupt: {what} is not valid JSON: a string holds the lone surrogate "
             f"\\u{ord(e.object[e.start]):04x}, which no UTF-8 text can hold")
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        fail(f"corrupt: {what} is not valid JSON: {shown(str(e).encode())}")


def parse_header(raw, data_size, fail):
    """The metadata and the tensors as (name, dtype, shape, begin, end) in the order of their
    data, which must tile the `data_size` bytes after the header exactly: the checks and words of
    lib/src/core/safetensors.cpp's parse_safetensors_header."""
    if raw[:1] != b"{":
        fail("corrupt or not a safetensors file: the header is not a JSON object (it starts with "
             "no '{')")
    header = parse_json(raw, "the header", fail)
    if not isinstance(header, dict):
        fail("the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        fail("__metadata__ is not an object")
    for key, value in metadata.items():
        if not isinstance(value, str):
            fail(f"__metadata__ '{shown(key.encode())}' is not a string")
    entries = []
    for name, e in header.items():
        label = f"tensor '{shown(name.encode())}'"
        if not isinstance(e, dict):
            fail(f"{label} is not an object in the header")
        for key in e:
            if key not in ("dtype", "shape", "data_offsets"):
                fail(f"{label} has an unknown field '{shown(key.encode())}'")
        dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not isinstance(dtype, str):
            fail(f"{label} has no dtype")
        if dtype not in DTYPES:
            fail(f"{label} has dtype {dumped(dtype)}; dptrain reads F32, F64, I64, BF16 and F16")
        if not isinstance(shape, list) or len(shape) > MAX_RANK:
            fail(f"{label} has no shape of rank 0 to {MAX_RANK}")
        element, numel = DTYPES[dtype][1], 1
        for d in shape:
            if not (type(d) is int and 0 <= d <= 2**62):
                fail(f"{label} has a bad dimension {dumped(d)}")
            if d and numel > data_size // element // d:  # the product stays below the data's
                fail(f"{label} has a shape larger than the data ({data_size} bytes)")
            numel *= d
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int and o >= 0 for o in offsets)):
            fail(f"{label} has no data_offsets [begin, end]")
        begin, end = offsets
        if end < begin or end - begin != numel * element:
            dims = ",".join(map(str, shape))
            fail(f"{label} has data_offsets [{begin}, {end}], its shape [{dims}] of "
                 f"{dtype} takes {numel * element} bytes")
        entries.append((name, dtype, shape, begin, end))
    entries.sort(key=lambda t: (t[3], t[4]))
    at = 0
    for name, _, _, begin, end in entries:
        if begin != at:
            fail(f"tensor '{shown(name.encode())}' starts at byte {begin} of the data, where {at} "
                 "was expected (a hole or an overlap)")
        at = end
    if at != data_size:
        fail(f"truncated or padded: the tensors take {at} bytes of data, the file holds "
             f"{data_size}")
    return {"metadata": metadata, "entries": entries, "data_offset": 8 + len(raw)}


def dumped(value):
    """A JSON value from the file as the C++ messages show it: a number or a string compact and
    cut at 40 bytes, an array or an object by its kind (a crafted one nests a million deep)."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return shown(text[:40] + b"..." if len(text) > 40 else text)


# ---- The model: the tensors a file of width w must hold ---------------------------------------

def model_tensors(width, num_classes=10, in_channels=1):
    """The book's ResNet-18 of `width` as dptrain builds it (lib/src/model/model.cpp, with the
    names of tests/support/pytorch_resnet.py): (name, dtype, shape) of its parameters, then its
    buffers, each in the model's order, as model.cpp's model_tensor_specs lists them."""
    params, buffers = [], []

    def conv(name, cin, cout, k):
        params.extend([(f"{name}.weight", "F32", [cout, cin, k, k]), (f"{name}.bias", "F32", [cout])])

    def batch_norm(name, c):
        params.extend([(f"{name}.weight", "F32", [c]), (f"{name}.bias", "F32", [c])])
        buffers.extend([(f"{name}.running_mean", "F32", [c]), (f"{name}.running_var", "F32", [c]),
                        (f"{name}.num_batches_tracked", "I64", [])])
    w = width
    conv("0", in_channels, w, 3)
    batch_norm("1", w)
    cin = w
    for stage, cout in enumerate((w, 2 * w, 4 * w, 8 * w), start=1):
        for block in range(2):
            at = f"resnet_block{stage}.{block}"
            conv(f"{at}.conv1", cin, cout, 3)
            conv(f"{at}.conv2", cout, cout, 3)
            if block == 0 and stage > 1:  # every stage but the first projects its shortcut
                conv(f"{at}.conv3", cin, cout, 1)
            batch_norm(f"{at}.bn1", cout)
            batch_norm(f"{at}.bn2", cout)
            cin = cout
    params.extend([("fc.1.weight", "F32", [num_classes, 8 * w]), ("fc.1.bias", "F32", [num_classes])])
    return params + buffers


def check_model_tensors(entries, width, fail):
    """checkpoint.cpp's check_model_tensors for dptrain's own files (exact): every tensor the
    model's, of its dtype and shape, in the file's data order; then the first the model has and
    the file lacks, in the model's order. Its words."""
    model = f"the width-{width} model"
    spec = {name: (dtype, shape) for name, dtype, shape in model_tensors(width)}
    for name, dtype, shape, _, _ in entries:
        base = next((name[len(p):] for p in STATE_PREFIXES if name.startswith(p)), name)
        if base not in spec:
            fail(f"holds tensor '{shown(name.encode())}', which {model} has not; not read")
        want_dtype, want_shape = spec[base]
        if (dtype, list(shape)) != (want_dtype, want_shape):
            fail(f"tensor '{shown(name.encode())}' is {dtype}[{','.join(map(str, shape))}], "
                 f"{model}'s is {want_dtype}[{','.join(map(str, want_shape))}]; not read")
    present = {e[0] for e in entries if not e[0].startswith(STATE_PREFIXES)}
    missing = [name for name, _, _ in model_tensors(width) if name not in present]
    if missing:
        more = f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""
        fail(f"has no tensor '{shown(missing[0].encode())}' of {model}{more}; not read")


# ---- The metadata: the version, the digest, the run state ----------------------------------

def netstring(text):
    raw = text.encode()
    return str(len(raw)).encode() + b":" + raw + b","


def digest(metadata, entries, data):
    """"dptrain.digest" (docs/checkpoints.md; Note [A digest of the content, not of the bytes]
    in checkpoint.cpp): of the metadata and of each tensor's name, dtype, shape and bytes, taken
    in the order of the names, so that neither the JSON's spelling nor the order of the data
    (which another writer, such as PyPI safetensors' save_file, chooses itself) changes it."""
    h = hashlib.sha256(b"dptrain safetensors digest 1\n")
    for key in sorted((k for k in metadata if k != "dptrain.digest"), key=str.encode):
        h.update(netstring(key) + netstring(metadata[key]))
    h.update(b"\n")
    for name, dtype, shape, begin, end in sorted(entries, key=lambda e: e[0].encode()):
        h.update(b"".join(map(netstring, (name, dtype, ",".join(map(str, shape))))))
        h.update(str(end - begin).encode() + b":")  # the netstring of its bytes, uncopied
        h.update(data[begin:end])
        h.update(b",")
    return "sha256:" + h.hexdigest()


def read_fields(obj, kinds, at, fail):
    """The fields `kinds` of `obj` (at `at` in the run state), each of its kind, as the C++
    RunStateReader reads them: by name, in its words; fields it does not know are left alone."""
    def wrong(key, what):
        fail(f"corrupt: run state: {at + '.' if at else ''}{key} {what}")
    if not isinstance(obj, dict):
        fail(f"corrupt: run state: {at or 'the run state'} is not an object")
    out = {}
    for key, kind in kinds.items():
        value = out[key] = obj.get(key, math.nan)
        if key not in obj and kind != "later":
            wrong(key, "is missing")
        elif kind == "int" and not (type(value) is int and -2**63 <= value < 2**63):
            wrong(key, "is not an integer of 64 bits")
        elif kind == "u64" and not (type(value) is int and 0 <= value < 2**64):
            wrong(key, "is not an integer from 0 to 2^64 - 1")
        elif kind == "str" and not isinstance(value, str):
            wrong(key, "is not a string")
        elif kind == "bool" and not isinstance(value, bool):
            wrong(key, "is not true or false")
        elif kind in ("real", "later") and key in obj:
            if not (value in ("nan", "inf", "-inf") or type(value) in (int, float)
                    and abs(value) < 2**1024):  # a float() that cannot overflow
                wrong(key, 'is not a number (nor "nan", "inf", "-inf")')
            out[key] = float(value)
    return out


def run_state_and_config(metadata, fail):
    """The run state's JSON and its config object, the first things the C++ reader reads of it."""
    if "dptrain.run_state" not in metadata:
        fail("corrupt: no run state (dptrain.run_state)")
    state = parse_json(metadata["dptrain.run_state"].encode(), "the run state", fail)
    config = read_fields(state, {"config": "any"}, "", fail)["config"]
    if not isinstance(config, dict):
        fail("corrupt: run state: config is not an object")
    return state, config


def run_state(metadata, fail):
    """"dptrain.run_state" as read_checkpoint's dict, read in the C++ reader's order, so that
    both name the same first fault."""
    state, config = run_state_and_config(metadata, fail)
    c = {"config": read_fields(config, CONFIG, "config", fail),
         **read_fields(state, POSITION, "", fail)}
    if "recipe" in config:
        c["config"]["recipe"] = read_fields(config["recipe"], RECIPE, "config.recipe", fail)
    c["partial_sums"] = read_fields(c["partial_sums"], SUMS, "partial_sums", fail)
    c.update(read_fields(state, {"partial_seconds": "real", "history": "any"}, "", fail))
    if not isinstance(c["history"], list):
        fail("corrupt: run state: history is not an array")
    c["history"] = [read_fields(s, STATS, f"history[{i}]", fail)
                    for i, s in enumerate(c["history"])]
    return c


def value_text(value):
    """A figure as the C++ reader's messages write it: a whole number in full, else as %g."""
    value = float(value)
    if math.isfinite(value) and value == math.trunc(value) and abs(value) < 1e18:
        return str(int(value))
    return "nan" if math.isnan(value) else "%g" % value


class ContentsCheck:
    """The contents checks' one wording, as checkpoint_run_state.cpp's ContentsCheck: every
    refusal names the field, its value and why."""
    def __init__(self, fail):
        self.fail = fail

    def impossible(self, field, value, why, text=value_text):
        self.fail(f"corrupt: impossible contents: {field} is {text(value)} ({why})")

    def at_least_zero(self, field, value):
        if not (math.isfinite(value) and value >= 0):
            self.impossible(field, value, "a finite number >= 0")

    def loss(self, field, value):
        if not (math.isnan(value) or value >= 0):
            self.impossible(field, value, "a loss: >= 0, inf or nan")

    def figure(self, field, value, high, why):  # NaN where the writer has none, else 0 to high
        if not (math.isnan(value) or 0 <= value <= high):
            self.impossible(field, value, why)


def check_contents(c, fail):
    """Note [A checkpoint's contents are checked, not only its digest] in checkpoint.cpp: a
    crafted file can carry a fitting digest, so every field must be one a run can have, checked
    in the C++ reader's order and words."""
    check = ContentsCheck(fail)
    impossible, at_least_zero, loss = check.impossible, check.at_least_zero, check.loss
    config, done, step = c["config"], c["epochs_done"], c["step_in_epoch"]
    for key, field, low, high in CONFIG_RANGES:  # an integer setting, named in full
        if not low <= config[key] <= high:
            impossible(field, config[key], f"dptrain writes {low} to {high}", str)
    if not (math.isfinite(config["lr"]) and config["lr"] > 0):
        impossible("the learning rate", config["lr"], "a finite number > 0")
    if not 0 <= done <= MAX_EPOCHS:
        impossible("the epochs done", done, f"dptrain writes 0 to {MAX_EPOCHS}", str)
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
    seen = step * config["batch_size"]
    if sums["count"] > seen or sums["count"] != math.trunc(sums["count"]):
        impossible("the epoch's example count", sums["count"],
                   f"a whole number of at most {seen}: {step} steps of batches of "
                   f"{config['batch_size']} into the epoch")
    if sums["correct"] != math.trunc(sums["correct"]):
        impossible("the epoch's correct count", sums["correct"], "a whole number")
    if sums["count"] == 0 and sums["loss_sum"] != 0:
        impossible("the epoch's loss sum", sums["loss_sum"], "over no examples: 0")
    if c["partial_seconds"] > MAX_SECONDS:
        impossible("the epoch's seconds", c["partial_seconds"],
                   f"at most {value_text(MAX_SECONDS)}, some 31 years")
    if not re.fullmatch(r"[0-9a-f]{64}", config["train_digest"]):
        fail(f"corrupt: impossible contents: the training set's digest is "
             f"'{shown(config['train_digest'][:80].encode())}' (a file of format version "
             f"{FORMAT_VERSION} carries the SHA-256 of its training set, 64 hex digits)")
    check_history(c, check, steps, shape)


def check_history(c, check, steps, shape):
    """The finished epochs' figures, as checkpoint_run_state.cpp's check_history."""
    impossible, at_least_zero, loss, figure = (check.impossible, check.at_least_zero, check.loss,
                                               check.figure)
    config, done = c["config"], c["epochs_done"]
    if len(c["history"]) != done:
        impossible("the history's length", len(c["history"]),
                   f"it holds the finished epochs, and {done} are done")
    for index, s in enumerate(c["history"]):
        at = f"epoch {index + 1} of the history: "
        if s["epoch"] != index + 1:
            impossible(at + "its number", s["epoch"], "the epochs are numbered 1, 2, ...")
        if not s["epoch"] <= s["epochs"] <= MAX_EPOCHS:
            impossible(at + "the run's epochs", s["epochs"],
                       f"from its number, {s['epoch']}, to {MAX_EPOCHS}")
        loss(at + "train loss", s["train_loss"])
        loss(at + "test loss", s["test_loss"])
        # An epoch in which no step trained has no train loss, accuracy or pace: all NaN.
        untrained = math.isnan(s["train_loss"])
        for key in ("seconds", "steps"):
            at_least_zero(at + key, s[key])
        if s["seconds"] > MAX_SECONDS:
            impossible(at + "seconds", s["seconds"], f"at most {value_text(MAX_SECONDS)}, some 31 "
                       "years")
        figure(at + "images per second", s["images_per_second"], MAX_IMAGES_PER_SECOND,
               f"nan, or from 0 to {value_text(MAX_IMAGES_PER_SECOND)}")
        if s["steps"] > steps:
            impossible(at + "steps", s["steps"], shape)
        figure(at + "train accuracy", s["train_acc"], 1, "nan, or an accuracy from 0 to 1")
        if not untrained:
            for key, name in (("train_acc", "train accuracy"),
                              ("images_per_second", "images per second")):
                if math.isnan(s[key]):
                    impossible(at + name, s[key], "a number where the epoch trained (its train "
                               f"loss is {value_text(s['train_loss'])})")
        if not 0 <= s["test_acc"] <= 1:
            impossible(at + "test accuracy", s["test_acc"], "an accuracy from 0 to 1")
        figure(at + "GPU milliseconds per step", s["gpu_ms_per_step"], MAX_SECONDS * 1000,
               f"nan, or from 0 to {value_text(MAX_SECONDS * 1000)}")
        devices = config["world_size"]
        figure(at + "TFLOP/s", s["tflops"], MAX_PEAK_TFLOPS * devices,
               f"nan, or from 0 to {value_text(MAX_PEAK_TFLOPS * devices)}: "
               f"{value_text(MAX_PEAK_TFLOPS)} a device, in a world of {devices}")
        figure(at + "MFU", s["mfu"], 1, "nan, or a fraction from 0 to 1")
        if not math.isnan(s["mfu"]) and math.isnan(s["tflops"]):
            impossible(at + "MFU", s["mfu"], "of nan TFLOP/s: nan")
        for key in ("peak_host_bytes", "peak_device_bytes"):
            value = s[key]  # a whole number: trunc is reached only below 2^50
            if not (math.isnan(value) or 0 <= value <= MAX_BYTES and value == math.trunc(value)):
                impossible(at + key.replace("_", " "), value,
                           "nan, or a whole number of bytes from 0 to 2^50")
        loss(at + "validation loss", s["val_loss"])  # nan without a validation set
        figure(at + "validation accuracy", s["val_acc"], 1, "nan, or an accuracy from 0 to 1")
        figure(at + "evaluation seconds", s["eval_seconds"], MAX_SECONDS,
               f"nan, or from 0 to {value_text(MAX_SECONDS)}")


def check_repeated_metadata(metadata, c, fail):
    """Note [Metadata that repeats the run state agrees with it] in checkpoint.cpp: a key that
    repeats the run state, where present, says what it says; the accuracy as any JSON number of
    exactly its value, and only after a finished epoch."""
    config, history = c["config"], c["history"]
    expected = {"dptrain.width": str(config["width"]),
                "dptrain.num_classes": str(config["num_classes"]),
                "dptrain.in_channels": str(config["in_channels"]),
                "dptrain.epochs_done": str(c["epochs_done"]),
                "dptrain.train_digest": config["train_digest"]}
    if history:
        expected["dptrain.test_acc"] = json.dumps(history[-1]["test_acc"])
    for key in ("dptrain.width", "dptrain.num_classes", "dptrain.in_channels",
                "dptrain.epochs_done", "dptrain.train_digest", "dptrain.test_acc"):
        text, want = metadata.get(key), expected.get(key)
        if text is None or text == want:
            continue
        if (key == "dptrain.test_acc" and want is not None and re.fullmatch(JSON_NUMBER, text)
                and float(text) == history[-1]["test_acc"]):
            continue
        gives = f'"{shown(want.encode())}"' if want is not None else "none (no epoch is finished)"
        fail(f'corrupt: metadata {key} is "{shown(text.encode()[:80])}" where the run state gives '
             f"{gives}")


def check_tensors(entries, data, fail):
    """check_checkpoint_tensors in checkpoint_run_state.cpp: no floating tensor holds NaN or an
    infinity (an element whose exponent bits are all set), and a BatchNorm running variance (a
    name ending in "running_var") holds no number below 0 (its sign bit set, and not -0)."""
    for name, dtype, _, begin, end in entries:
        _, size, mask = DTYPES[dtype]
        if mask is None or begin == end:
            continue
        sign = 1 << (8 * size - 1)
        words = memoryview(data[begin:end]).cast({2: "H", 4: "I", 8: "Q"}[size])
        label = f"tensor '{shown(name.encode())}'"
        if any((word & mask) == mask for word in words):
            fail(f"corrupt: impossible contents: {label} holds NaN or an infinity (dptrain never "
                 "saves the weights of a non-finite step); not used")
        if name.endswith("running_var"):
            negative = [i for i, word in enumerate(words) if word & sign and word & (sign - 1)]
            if negative:
                at = begin + negative[0] * size
                value = (struct.unpack("<f", b"\0\0" + bytes(data[at:at + 2]))[0]
                         if dtype == "BF16" else
                         struct.unpack_from({2: "<e", 4: "<f", 8: "<d"}[size], data, at)[0])
                fail(f"corrupt: impossible contents: {label} (a BatchNorm running variance) "
                     f"holds {value_text(value)} (a variance is >= 0); not used")


def check_width_first(metadata, fail):
    """As checkpoint.cpp's open_safetensors: a file of this format version has its run state's
    width checked before anything is sized from it, so that a width no run has is called corrupt
    (check_claimed_width in checkpoint_run_state.cpp), not too large for its size bound."""
    if (metadata.get("dptrain.format_version") != str(FORMAT_VERSION)
            or "dptrain.run_state" not in metadata):
        return  # named in parse's order
    width = claimed_width(metadata, fail)
    if not 1 <= width <= 4096:
        fail(f"corrupt: impossible contents: width is {width} (dptrain writes 1 to 4096)")


def claimed_width(metadata, fail):
    """checkpoint_run_state.cpp's run_state_width: config.width of the run state, read before
    the rest of it (its other faults are named later, in the C++ reader's order)."""
    _, config = run_state_and_config(metadata, fail)
    return read_fields(config, {"width": "int"}, "config", fail)["width"]


def parse(c, fail, check_weights=True, check_model=True):
    """read_checkpoint's dict from read_file's: the checks after the header's, in the order of
    the C++ reader's checkpoint_from."""
    metadata, entries = c["metadata"], c["entries"]
    version = metadata.get("dptrain.format_version")
    if version is None:
        fail("a safetensors file without dptrain's run state, not a checkpoint "
             "(safetensors.torch.load_file reads its tensors)")
    if re.fullmatch(r"[0-9]{1,9}", version) and int(version) > FORMAT_VERSION:
        fail(f"format version {version}, written by a newer dptrain; this script reads version "
             f"{FORMAT_VERSION}")
    if version != str(FORMAT_VERSION):
        fail(f"corrupt: format version '{shown(version.encode())}'")
    if check_model:
        # As checkpoint.cpp's open_safetensors, before the digest: the model of the width the run
        # state claims (a width out of range is named by check_contents).
        width = claimed_width(metadata, fail)
        if 1 <= width <= 4096:
            check_model_tensors(entries, width, fail)
    data = memoryview(c["file"])[c["data_offset"]:]
    if "dptrain.digest" not in metadata:
        fail("corrupt: no digest (dptrain.digest)")
    if metadata["dptrain.digest"] != digest(metadata, entries, data):
        fail("corrupt: the content digest does not match (the file was damaged or changed after "
             "dptrain wrote it)")
    if metadata.get("dptrain.kind") not in ("checkpoint", "model"):
        fail('corrupt: dptrain.kind is neither "checkpoint" nor "model"')
    result = run_state(metadata, fail)
    check_contents(result, fail)
    check_repeated_metadata(metadata, result, fail)
    if check_weights:
        check_tensors(entries, data, fail)
    result.update(format_version=FORMAT_VERSION, kind=metadata["dptrain.kind"], metadata=metadata,
                  tensors=[(name, DTYPES[dtype][0], shape, bytes(data[begin:end]))
                           for name, dtype, shape, begin, end in entries])
    return result


def read_checkpoint(path, load_tensors=True, check_weights=True, check_model=True):
    """The file at `path` as a dict ("tensors": (name, dtype, dims, raw bytes); with load_tensors
    "state_dict" too, which needs torch); raises CheckpointError for anything else. Without
    check_weights, weights no run saves (NaN, an infinity, a negative running variance) are
    read as they are: compare_models.py must find them, not refuse them. Without check_model,
    tensors other than the model's are read too (the parser's own tests use small files)."""
    def fail(why):
        raise CheckpointError(f"checkpoint {shown(path)}: {why}")
    raw = read_file(path, fail)
    result = parse(raw, fail, check_weights, check_model)
    if load_tensors:
        result["state_dict"] = state_dict(result["tensors"], raw["file"])
    return result


def state_dict(tensors, file):
    """The tensors in file order: PyPI safetensors' own reader of the whole file where it is
    importable, else torch.frombuffer of each one's bytes (both copy: no tensor shares `file`)."""
    import torch
    try:
        from safetensors.torch import load
    except ImportError:
        return collections.OrderedDict(
            (name, torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(dims)
             if raw else torch.empty(dims, dtype=getattr(torch, dtype)))
            for name, dtype, dims, raw in tensors)
    loaded = load(bytes(file))
    return collections.OrderedDict((name, loaded[name]) for name, *_ in tensors)


# ---- Command line ----------------------------------------------------------------------------

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
    lines = [f"{shown(name.encode())} {dtype} {'x'.join(map(str, dims)) or 'scalar'} "
             f"{hashlib.sha256(raw).hexdigest()}"
             for name, dtype, dims, raw in c["tensors"] if args.tensor_digests]
    if args.json:
        lines.append(json.dumps(json_figures({k: v for k, v in c.items() if k != "tensors"}),
                                indent=1, sort_keys=True, allow_nan=False))
    if not (args.json or args.tensor_digests):
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
    args = parser.parse_args()
    try:
        lines = output_lines(args, read_checkpoint(args.checkpoint, load_tensors=False))
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
    except OSError as e:  # a full device, a closed pipe: one line, not a traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"error: cannot write to standard output: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's status for SIGINT, no traceback
        print("error: interrupted; nothing was written", file=sys.stderr)
        sys.exit(130)
