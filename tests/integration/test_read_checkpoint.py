#!/usr/bin/env python3
"""scripts/read_checkpoint.py against hostile files: each row builds a file and names the one
error line the script must give (exit status 1), run as a subprocess with a 20 s limit (a hang
fails) and 1 GiB of address space (a whole-file read of a 4 GiB file fails). Then valid files
read back exactly, by the script, by PyPI safetensors and by the script with safetensors hidden,
and a deterministic mutation test of the parser in-process. Not here: the C++ reader's own tests
(tests/train/test_checkpoint.cpp).

    .venv-tests/bin/python3 tests/integration/test_read_checkpoint.py [-v]   # scripts/test-venv.sh

The files are written by tests/support/dptrain_safetensors.py from the format's specification
(docs/checkpoints.md), independently of the script's reader.
"""
import hashlib
import importlib.util
import json
import math
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import dptrain_safetensors as st  # noqa: E402

SCRIPT = os.environ.get("READ_CHECKPOINT_SCRIPT") or os.path.join(HERE, "..", "..", "scripts",
                                                                  "read_checkpoint.py")
CORPUS = os.path.join(HERE, "..", "..", "fuzz", "corpus", "fuzz_checkpoint")
TIMEOUT_S = 20  # per run of the script: far above its real time, far below a test's limit
MEMORY_BYTES = 1 << 30  # a run without torch needs a few tens of MiB

import torch  # noqa: E402  (the venv has Debian's python3-torch and PyPI safetensors)
from safetensors.torch import load_file, save_file  # noqa: E402


def load_script():
    spec = importlib.util.spec_from_file_location("read_checkpoint_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def valid(edit_state=None, edit_metadata=None, tensors=None, **kw):
    """A valid file (tests/support/dptrain_safetensors.py's valid_state and the width-4 model's
    tensors, model_tensors), with `edit_state(state)` and `edit_metadata(metadata)` applied
    before the digest is taken."""
    state = st.valid_state()
    if edit_state:
        edit_state(state)
    return st.checkpoint(state, st.model_tensors() if tensors is None else tensors,
                         edit=edit_metadata, **kw)


def with_tensor(name, raw, dtype="F32"):
    """The width-4 model's tensors with `name`'s bytes (and dtype) replaced."""
    return [(n, dtype, shape, raw) if n == name else (n, d, shape, r)
            for n, d, shape, r in st.model_tensors()]


def swapped(data, a, b):
    """`data` with the tensor names `a` and `b` swapped in its header."""
    a, b = f'"{a}"'.encode(), f'"{b}"'.encode()
    return data.replace(a, b'"\0"').replace(b, a).replace(b'"\0"', b)


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


class ScriptTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="read_checkpoint_test.")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def write(self, name, data):
        with open(self.path(name), "wb") as f:
            f.write(data)
        return self.path(name)

    def run_script(self, *args, stdout=subprocess.PIPE):
        """(exit status, stdout, stderr) of the script on `args`; a run past TIMEOUT_S fails."""
        try:
            done = subprocess.run([sys.executable, SCRIPT, *args], stdout=stdout,
                                  stderr=subprocess.PIPE, timeout=TIMEOUT_S,
                                  preexec_fn=limit_memory)
        except subprocess.TimeoutExpired:
            self.fail(f"read_checkpoint.py {' '.join(args)}: still running after {TIMEOUT_S} s")
        out = done.stdout.decode(errors="backslashreplace") if done.stdout is not None else ""
        return done.returncode, out, done.stderr.decode(errors="backslashreplace")

    def expect_error(self, args, line, status=1):
        """Exactly "error: `line`" on stderr, nothing on stdout, exit status `status`."""
        code, out, err = self.run_script(*args)
        self.assertEqual(err, f"error: {line}\n")
        self.assertEqual(out, "")
        self.assertEqual(code, status, err)

    def expect_rows(self, rows):
        """Rows of (label, bytes, expected line after "checkpoint PATH: ")."""
        for label, data, why in rows:
            with self.subTest(label):
                path = self.write("bad.safetensors", data)
                self.expect_error([path], f"checkpoint {path}: {why}")


# ---- Only regular files, without waiting -----------------------------------------------------

class NonRegularPaths(ScriptTest):
    def test_are_refused_at_once_naming_the_kind(self):
        fifo, directory, sock = self.path("fifo"), self.path("dir"), self.path("sock")
        os.mkfifo(fifo)  # no writer ever comes: an open that waits for one hangs
        os.mkdir(directory)
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(sock)
        rows = [(fifo, "a FIFO"), (directory, "a directory"), ("/dev/null", "a character device"),
                (sock, "a socket")]
        for path, kind in rows:
            with self.subTest(kind):
                self.expect_error([path], f"checkpoint {path}: not a regular file ({kind})")

    def test_a_missing_file_cannot_be_opened(self):
        path = self.path("missing")
        self.expect_error([path], f"checkpoint {path}: cannot open: No such file or directory")


# ---- The layout: length, header, offsets; refused before the data is read -------------------

def header_with(entries, metadata=None, data=b""):
    """A file of a hand-made header: `entries` maps names to their JSON objects."""
    header = {"__metadata__": metadata or st.metadata_of(st.valid_state()), **entries}
    return st.layout(header, data)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


class Layout(ScriptTest):
    def test_sizes_are_checked_before_anything_is_read(self):
        good = valid()
        n = struct.unpack_from("<Q", good)[0]
        data = len(good) - 8 - n
        short = "bytes, shorter than a safetensors file's 8-byte header length"
        self.expect_rows([
            ("five bytes", good[:5], f"truncated: 5 {short}"),
            ("empty", b"", f"truncated: 0 {short}"),
            ("header length 2^63", struct.pack("<Q", 2**63) + good[8:],
             "not a safetensors file of dptrain's, or corrupt: its first 8 bytes give a header "
             f"of {2**63} bytes, more than the 16777216 dptrain reads"),
            ("header longer than the file", good[:8 + n - 1],
             f"truncated or corrupt: the header length says {n} bytes, the file has {n - 1} "
             "after it"),
            ("header of 1 byte", struct.pack("<Q", 1) + b"{",
             "truncated or corrupt: the header length says 1 bytes, the file has 1 after it"),
            ("data cut", good[:-3], f"truncated or padded: the tensors take {data} bytes of "
             f"data, the file holds {data - 3}"),
            ("data padded", good + b"\0", f"truncated or padded: the tensors take {data} bytes "
             f"of data, the file holds {data + 1}"),
        ])

    def test_a_file_larger_than_its_model_is_refused_unread(self):
        # 8 bytes for each of the 51,752 elements a width-4 ResNet-18 has at most, three times:
        # the weights, their momentum buffers and their average (lib/src/train/checkpoint.cpp's
        # checkpoint_size_limit).
        limit = 3 * 8 * 51752
        size = 2**32  # sparse: 4 GiB that occupy no disk, and more than RLIMIT_AS lets it read
        head = header_with({"w": entry("F32", [size // 4], 0, size)})
        path = self.write("huge.safetensors", head)
        os.truncate(path, len(head) + size)
        if os.stat(path).st_blocks * 512 > 1 << 20:
            self.skipTest("this file system has no sparse files")
        self.expect_error([path], f"checkpoint {path}: {size} bytes of tensors, more than the "
                          f"model its metadata claims can hold (at most {limit}); not read")

    def test_headers_that_do_not_fit_their_data_in_the_cpp_readers_words(self):
        four = b"\0" * 4
        twice = (b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                 b'"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}')
        dtypes = "dptrain reads F32, F64, I64, BF16 and F16"
        self.expect_rows([
            ("a list", st.layout([1, 2], b""), "corrupt or not a safetensors file: the header is "
             "not a JSON object (it starts with no '{')"),
            ("not JSON", struct.pack("<Q", 4) + b"{abc", "corrupt: the header is not valid "
             "JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
            ("not UTF-8", struct.pack("<Q", 3) + b"{\"\xff", "corrupt: the header is not valid "
             "JSON: 'utf-8' codec can't decode byte 0xff in position 2: invalid start byte"),
            ("a lone surrogate in a name", header_with({"\ud800": entry("F32", [1], 0, 4)},
                                                       data=four),
             "corrupt: the header is not valid JSON: a string holds the lone surrogate \\ud800, "
             "which no UTF-8 text can hold"),
            ("a name twice", struct.pack("<Q", len(twice)) + twice + four * 2,
             "corrupt: the header is not valid JSON: the name 'w' appears twice"),
            ("metadata a list", st.layout({"__metadata__": []}, b""),
             "__metadata__ is not an object"),
            ("a number in the metadata", st.safetensors([], {"dptrain.width": 4}),
             "__metadata__ 'dptrain.width' is not a string"),
            ("an entry a list", header_with({"w": []}), "tensor 'w' is not an object in the "
             "header"),
            ("an extra field", header_with({"w": {**entry("F32", [1], 0, 4), "x": 1}}, data=four),
             "tensor 'w' has an unknown field 'x'"),
            ("no dtype", header_with({"w": {"shape": [1], "data_offsets": [0, 4]}}, data=four),
             "tensor 'w' has no dtype"),
            ("dtype unknown", header_with({"w": entry("Q8", [1], 0, 1)}, data=b"\0"),
             f"tensor 'w' has dtype \"Q8\"; {dtypes}"),
            ("dtype a number", header_with({"w": entry(1, [1], 0, 4)}, data=four),
             "tensor 'w' has no dtype"),
            ("rank 9", header_with({"w": entry("F32", [1] * 9, 0, 4)}, data=four),
             "tensor 'w' has no shape of rank 0 to 8"),
            ("a negative dimension", header_with({"w": entry("F32", [-1], 0, 0)}),
             "tensor 'w' has a bad dimension -1"),
            ("a dimension 1.0", header_with({"w": entry("F32", [1.0], 0, 4)}, data=four),
             "tensor 'w' has a bad dimension 1.0"),
            ("a shape past 2^64 elements", header_with({"w": entry("F32", [2**62, 2**62], 0, 4)},
                                                        data=four),
             "tensor 'w' has a shape larger than the data (4 bytes)"),
            ("offsets reversed", header_with({"w": entry("F32", [0], 4, 0)}, data=four),
             "tensor 'w' has data_offsets [4, 0], its shape [0] of F32 takes 0 bytes"),
            ("offsets negative", header_with({"w": entry("F32", [0], -4, 0)}, data=four),
             "tensor 'w' has no data_offsets [begin, end]"),
            ("shape 3, data 2 floats", header_with({"w": entry("F32", [3], 0, 8)}, data=four * 3),
             "tensor 'w' has data_offsets [0, 8], its shape [3] of F32 takes 12 bytes"),
            ("a hole", header_with({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)},
                                   data=four * 3),
             "tensor 'b' starts at byte 8 of the data, where 4 was expected (a hole or an "
             "overlap)"),
            ("an overlap", header_with({"a": entry("F32", [2], 0, 8),
                                        "b": entry("F32", [1], 4, 8)}, data=four * 2),
             "tensor 'b' starts at byte 4 of the data, where 8 was expected (a hole or an "
             "overlap)"),
            ("data before the first tensor", header_with({"a": entry("F32", [1], 4, 8)},
                                                         data=four * 2),
             "tensor 'a' starts at byte 4 of the data, where 0 was expected (a hole or an "
             "overlap)"),
        ])

    def test_foreign_and_other_versions(self):
        dptrnckp = b"DPTRNCKP" + struct.pack("<IQI", 2, 0, 0)
        with zipfile.ZipFile(self.path("model.pt"), "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02cos\nsystem\n.")  # what an unpickler runs
        with open(self.path("model.pt"), "rb") as f:
            archive = f.read()

        def version(text):
            return lambda m: m.__setitem__("dptrain.format_version", text)
        self.expect_rows([
            ("DPTRNCKP", dptrnckp, "format version 2 (DPTRNCKP), which only dptrain itself still "
             "reads; resume or eval it with dptrain, or save it again"),
            ("DPTRNCKP cut", dptrnckp[:10], "format version ? (DPTRNCKP), which only dptrain "
             "itself still reads; resume or eval it with dptrain, or save it again"),
            ("zip", archive, "a zip archive (TorchScript or torch.save), not a dptrain file; this "
             "reader never opens archives, because loading one runs the code it may carry"),
            ("another program's", st.safetensors([("w", "F32", [1], b"\0" * 4)], {"a": "b"}),
             "a safetensors file without dptrain's run state, not a checkpoint "
             "(safetensors.torch.load_file reads its tensors)"),
            ("no metadata", st.safetensors([("w", "F32", [1], b"\0" * 4)], None),
             "a safetensors file without dptrain's run state, not a checkpoint "
             "(safetensors.torch.load_file reads its tensors)"),
            ("version 4", valid(edit_metadata=version("4")), "format version 4, written by a "
             "newer dptrain; this script reads version 3"),
            ("version 2 in safetensors", valid(edit_metadata=version("2")),
             "corrupt: format version '2'"),
            ("version 03", valid(edit_metadata=version("03")), "corrupt: format version '03'"),
            ("version \\x1b", valid(edit_metadata=version("\x1b[2J")),
             "corrupt: format version '\\x1b[2J'"),
        ])


# ---- The digest ----------------------------------------------------------------------------

class Digest(ScriptTest):
    def test_any_change_to_the_contents_is_found(self):
        good = valid()
        n = struct.unpack_from("<Q", good)[0]
        header = json.loads(good[8:8 + n])
        edited = dict(header)
        edited["__metadata__"] = {**header["__metadata__"], "dptrain.width": "8"}
        text = json.dumps(edited).encode()
        mismatch = ("corrupt: the content digest does not match (the file was damaged or changed "
                    "after dptrain wrote it)")
        self.expect_rows([
            ("a data bit", good[:-1] + bytes([good[-1] ^ 1]), mismatch),
            ("a metadata value", struct.pack("<Q", len(text)) + text + good[8 + n:], mismatch),
            ("no digest", st.safetensors(st.model_tensors(), st.metadata_of(st.valid_state())),
             "corrupt: no digest (dptrain.digest)"),
            ("two tensors' names swapped", swapped(valid(), "1.weight", "1.bias"), mismatch),
        ])

    def test_the_digest_covers_content_not_spelling(self):
        """The same metadata and tensors in the same order, written by PyPI safetensors with
        another header (its own key order, no padding spaces of ours) still verify."""
        path = self.write("good.safetensors", valid())
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            metadata = json.loads(f.read(n))["__metadata__"]
        save_file(load_file(path), self.path("again.safetensors"), metadata=metadata)
        with open(path, "rb") as a, open(self.path("again.safetensors"), "rb") as b:
            self.assertNotEqual(a.read(), b.read())
        code, out, err = self.run_script(self.path("again.safetensors"))
        self.assertEqual((code, err), (0, ""))

    def test_a_rewrite_in_another_order_verifies_and_swapped_names_do_not(self):
        """PyPI safetensors' save_file writes the tensors ordered by dtype, then by name, so the
        offsets of nearly every tensor change; the digest takes the tensors by name and holds no
        offsets, so the rewrite verifies. Two tensors of one dtype and shape whose names are
        swapped keep every offset, shape and byte of the table, and fail."""
        tensors = st.model_tensors()
        path = self.write("ours.safetensors", valid(tensors=tensors))
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            ours = json.loads(f.read(n))
        metadata = ours.pop("__metadata__")
        loaded = load_file(path)
        save_file(loaded, self.path("theirs.safetensors"), metadata=metadata)
        with open(self.path("theirs.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            theirs = json.loads(f.read(n))
        del theirs["__metadata__"]

        def data_order(header):
            return sorted(header, key=lambda name: header[name]["data_offsets"])
        self.assertEqual(data_order(ours), [name for name, *_ in tensors])
        # Its dtype order: I64, F64, F32, BF16, F16 (the Rust crate's Dtype enum, reversed).
        self.assertEqual(data_order(theirs), sorted(
            (name for name, *_ in tensors), key=lambda name: (ours[name]["dtype"] != "I64", name)))
        self.assertEqual({name: (e["dtype"], e["shape"]) for name, e in theirs.items()},
                         {name: (e["dtype"], e["shape"]) for name, e in ours.items()})
        code, out, err = self.run_script(self.path("theirs.safetensors"), "--tensor-digests")
        self.assertEqual((code, err), (0, ""))
        names = {"F32": "float32", "I64": "int64"}
        self.assertEqual(sorted(out.splitlines()), sorted(
            f"{name} {names[dtype]} {'x'.join(map(str, dims)) or 'scalar'} "
            f"{hashlib.sha256(raw).hexdigest()}" for name, dtype, dims, raw in tensors))

        names_swapped = {**loaded, "1.weight": loaded["1.bias"], "1.bias": loaded["1.weight"]}
        save_file(names_swapped, self.path("swapped.safetensors"), metadata=metadata)
        path = self.path("swapped.safetensors")
        self.expect_error([path], f"checkpoint {path}: corrupt: the content digest does not "
                          "match (the file was damaged or changed after dptrain wrote it)")


# ---- The run state: everything a run can have, nothing else ----------------------------------

def impossible_rows():
    """(label, edit of the run state, expected "impossible contents" text): the C++ words."""
    def field(*keys, value):
        def edit(c):
            for key in keys[:-1]:
                c = c[key]
            c[keys[-1]] = value
        return edit
    nan, inf = float("nan"), float("inf")
    shape = "an epoch of 256 images in batches of 32 has 8 steps"

    def shorter_history(c):
        c["history"].pop()
    return [
        ("width 0", field("config", "width", value=0), "width is 0 (dptrain writes 1 to 4096)"),
        ("width 4097", field("config", "width", value=4097),
         "width is 4097 (dptrain writes 1 to 4096)"),
        ("no classes", field("config", "num_classes", value=0),
         "the class count is 0 (dptrain writes 1 to 65536)"),
        ("in_channels", field("config", "in_channels", value=65537),
         "the input channel count is 65537 (dptrain writes 1 to 65536)"),
        ("batch_size -32", field("config", "batch_size", value=-32),
         "the batch size is -32 (dptrain writes 1 to 2147483647)"),
        ("train_size 2^31", field("config", "train_size", value=2**31),
         "the training-set size is 2147483648 (dptrain writes 1 to 2147483647)"),
        ("world_size", field("config", "world_size", value=2**20 + 1),
         "the world size is 1048577 (dptrain writes 1 to 1048576)"),
        ("lr 0", field("config", "lr", value=0.0), "the learning rate is 0 (a finite number > 0)"),
        ("lr -inf", field("config", "lr", value=-inf),
         "the learning rate is -inf (a finite number > 0)"),
        ("lr nan", field("config", "lr", value=nan),
         "the learning rate is nan (a finite number > 0)"),
        ("epochs_done -1", field("epochs_done", value=-1),
         "the epochs done is -1 (dptrain writes 0 to 1000000)"),
        ("step past the epoch", field("step_in_epoch", value=8),
         f"the step in the epoch is 8 ({shape})"),
        ("step -1", field("step_in_epoch", value=-1), f"the step in the epoch is -1 ({shape})"),
        ("global step one short", field("global_step", value=18),
         f"the global step is 18 (epoch 2 step 3 is global step 19; {shape})"),
        ("global step 2^63 - 1", field("global_step", value=2**63 - 1),
         f"the global step is 9.22337e+18 (epoch 2 step 3 is global step 19; {shape})"),
        ("loss sum -1", field("partial_sums", "loss_sum", value=-1.0),
         "the epoch's loss sum is -1 (a loss: >= 0, inf or nan)"),
        ("correct -1", field("partial_sums", "correct", value=-1.0),
         "the epoch's correct count is -1 (a finite number >= 0)"),
        ("count inf", field("partial_sums", "count", value=inf),
         "the epoch's example count is inf (a finite number >= 0)"),
        ("seconds inf", field("partial_seconds", value=inf),
         "the epoch's seconds is inf (a finite number >= 0)"),
        ("count past the set", field("partial_sums", "count", value=257.0),
         "the epoch's correct count is 40 (of 257 examples, from a training set of 256)"),
        ("correct past the count", field("partial_sums", "correct", value=96.5),
         "the epoch's correct count is 96.5 (of 96 examples, from a training set of 256)"),
        ("history shorter", shorter_history,
         "the history's length is 1 (it holds the finished epochs, and 2 are done)"),
        ("history out of order", field("history", 1, "epoch", value=3),
         "epoch 2 of the history: its number is 3 (the epochs are numbered 1, 2, ...)"),
        ("train loss -0.5", field("history", 0, "train_loss", value=-0.5),
         "epoch 1 of the history: train loss is -0.5 (a loss: >= 0, inf or nan)"),
        ("test loss -inf", field("history", 0, "test_loss", value=-inf),
         "epoch 1 of the history: test loss is -inf (a loss: >= 0, inf or nan)"),
        ("seconds -1", field("history", 0, "seconds", value=-1.0),
         "epoch 1 of the history: seconds is -1 (a finite number >= 0)"),
        ("images per second -inf", field("history", 0, "images_per_second", value=-inf),
         "epoch 1 of the history: images per second is -inf (nan, or from 0 to 1000000000000)"),
        ("steps -1", field("history", 1, "steps", value=-1),
         "epoch 2 of the history: steps is -1 (a finite number >= 0)"),
        ("accuracy 1.5", field("history", 0, "train_acc", value=1.5),
         "epoch 1 of the history: train accuracy is 1.5 (nan, or an accuracy from 0 to 1)"),
        ("accuracy nan", field("history", 1, "test_acc", value=nan),
         "epoch 2 of the history: test accuracy is nan (an accuracy from 0 to 1)"),
    ]


def run_state_text(text):
    return lambda m: m.__setitem__("dptrain.run_state", text)


def state_json(edit):
    """The run state's JSON after `edit` of its parsed form (for fields of the wrong kind)."""
    run = json.loads(st.metadata_of(st.valid_state())["dptrain.run_state"])
    edit(run)
    return run_state_text(json.dumps(run))


class RunState(ScriptTest):
    def test_impossible_contents_are_refused_naming_the_field_and_why(self):
        # A width out of range has no model to check the tensors against: the small tensors
        # keep the size bound (at most a width-1 model's data) out of the way.
        self.expect_rows([(label, valid(edit, tensors=st.valid_tensors() if label.startswith(
                              "width") else None), f"corrupt: impossible contents: {why}")
                          for label, edit, why in impossible_rows()])

    def test_a_run_state_of_another_shape_is_refused_in_the_cpp_readers_words(self):
        self.expect_rows([(label, valid(edit_metadata=edit), why) for label, edit, why in [
            ("missing", lambda m: m.pop("dptrain.run_state"),
             "corrupt: no run state (dptrain.run_state)"),
            ("not JSON", run_state_text("{"), "corrupt: the run state is not valid JSON: "
             "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
            ("NaN literal", state_json(lambda r: r.update(partial_seconds=float("nan"))),
             "corrupt: the run state is not valid JSON: NaN is no JSON number (dptrain writes "
             "the string \"nan\" or \"inf\")"),
            ("a list", run_state_text("[]"),
             "corrupt: run state: the run state is not an object"),
            ("no config", state_json(lambda r: r.pop("config")),
             "corrupt: run state: config is missing"),
            ("config a list", state_json(lambda r: r.update(config=[])),
             "corrupt: run state: config is not an object"),
            ("a step 3.0", state_json(lambda r: r.update(step_in_epoch=3.0)),
             "corrupt: run state: step_in_epoch is not an integer of 64 bits"),
            ("a step true", state_json(lambda r: r.update(step_in_epoch=True)),
             "corrupt: run state: step_in_epoch is not an integer of 64 bits"),
            ("a step of 2^63", state_json(lambda r: r.update(global_step=2**63)),
             "corrupt: run state: global_step is not an integer of 64 bits"),
            ("a seed of 2^64", state_json(lambda r: r["config"].update(seed=2**64)),
             "corrupt: run state: config.seed is not an integer from 0 to 2^64 - 1"),
            ("a seed of -1", state_json(lambda r: r["config"].update(seed=-1)),
             "corrupt: run state: config.seed is not an integer from 0 to 2^64 - 1"),
            ("lr a word", state_json(lambda r: r["config"].update(lr="fast")),
             "corrupt: run state: config.lr is not a number (nor \"nan\", \"inf\", \"-inf\")"),
            ("a digest of digits", state_json(lambda r: r["config"].update(train_digest=5)),
             "corrupt: run state: config.train_digest is not a string"),
            ("sums a number", state_json(lambda r: r.update(partial_sums=1)),
             "corrupt: run state: partial_sums is not an object"),
            ("history an object", state_json(lambda r: r.update(history={})),
             "corrupt: run state: history is not an array"),
            ("an epoch without seconds", state_json(lambda r: r["history"][1].pop("seconds")),
             "corrupt: run state: history[1].seconds is missing"),
            ("an int of 5000 digits", run_state_text('{"epochs_done":' + "9" * 5000 + "}"),
             "corrupt: the run state is not valid JSON: Exceeds the limit (4300 digits) for "
             "integer string conversion: value has 5000 digits; use sys.set_int_max_str_digits() "
             "to increase the limit"),
        ]])

    def test_fields_it_does_not_know_are_left_alone_and_later_figures_may_be_absent(self):
        def edit(run):
            run["x"] = {"a newer": "field"}
            for key in ("gpu_ms_per_step", "tflops", "mfu", "peak_host_bytes",
                        "peak_device_bytes"):
                del run["history"][0][key]
        path = self.write("older.safetensors", valid(edit_metadata=state_json(edit)))
        code, out, err = self.run_script(path, "--json")
        self.assertEqual((code, err), (0, ""))
        history = json.loads(out)["history"]
        self.assertEqual((history[0]["tflops"], history[0]["peak_host_bytes"]), ("nan", "nan"))
        self.assertEqual(history[1]["peak_host_bytes"], 123456789.0)


# ---- Valid files: read back exactly, by the script and by PyPI safetensors -----------------

def expected_json(state, kind="checkpoint"):
    metadata = st.metadata_of(state, kind)
    metadata["dptrain.digest"] = st.digest(metadata, st.model_tensors())
    return st.figures({**state, "format_version": 3, "kind": kind, "metadata": metadata})


class Issue44(ScriptTest):
    """The third hostile round: bounds from what the process can hold, figures and weights no run
    has, Ctrl-C."""

    def test_a_width_the_memory_cannot_hold_is_refused_unread(self):
        # Sparse: a header claiming width 1024 (some 22 GiB of data, far past the 1 GiB the
        # script runs under) over 2 GiB of holes. The claim is refused before the data is read.
        size = 2**31
        head = header_with({"w": entry("F32", [size // 4], 0, size)},
                           metadata={**st.metadata_of(st.valid_state()), "dptrain.width": "1024"})
        path = self.write("wide.safetensors", head)
        os.truncate(path, len(head) + size)
        code, out, err = self.run_script(path)
        self.assertEqual((code, out), (1, ""), err)
        self.assertRegex(err, rf"^error: checkpoint {path}: claims a model of width 1024, whose "
                         r"data needs about 21\.89 GiB, and [0-9.]+ GiB of memory is available; "
                         r"not read\n$")

    def test_figures_no_run_has_are_refused_as_dptrain_refuses_them(self):
        def sums(**kw):
            return lambda s: s["partial_sums"].update(**kw)
        self.expect_rows([(label, valid(edit), f"corrupt: impossible contents: {why}")
                          for label, edit, why in [
            ("97 examples after 3 steps", sums(count=97.0), "the epoch's example count is 97 "
             "(a whole number of at most 96: 3 steps of batches of 32 into the epoch)"),
            ("half an example", sums(count=95.5), "the epoch's example count is 95.5 (a whole "
             "number of at most 96: 3 steps of batches of 32 into the epoch)"),
            ("half a correct one", sums(correct=39.5), "the epoch's correct count is 39.5 (a "
             "whole number)"),
            ("a loss over no examples",
             lambda s: s.update(step_in_epoch=0, global_step=16,
                                partial_sums={"loss_sum": 2.5, "correct": 0.0, "count": 0.0}),
             "the epoch's loss sum is 2.5 (over no examples: 0)"),
            ("1e300 s into the epoch", lambda s: s.update(partial_seconds=1e300),
             "the epoch's seconds is 1e+300 (at most 1000000000, some 31 years)"),
            ("an epoch of 1e300 s", lambda s: s["history"][0].update(seconds=1e300),
             "epoch 1 of the history: seconds is 1e+300 (at most 1000000000, some 31 years)"),
            ("1e300 images a second", lambda s: s["history"][1].update(images_per_second=1e300),
             "epoch 2 of the history: images per second is 1e+300 (nan, or from 0 to "
             "1000000000000)"),
            ("9 steps of 8", lambda s: s["history"][0].update(steps=9), "epoch 1 of the "
             "history: steps is 9 (an epoch of 256 images in batches of 32 has 8 steps)"),
            ("an emptied digest", lambda s: s["config"].update(train_digest=""),
             "the training set's digest is '' (a file of format version 3 carries the SHA-256 "
             "of its training set, 64 hex digits)"),
        ]])

    def test_weights_no_run_has_are_refused_naming_the_tensor(self):
        nan, inf = float("nan"), float("inf")
        rows = [
            ("a NaN F32", with_tensor("0.bias", struct.pack("<4f", 1.0, nan, 0.0, 0.0)), "0.bias"),
            ("an infinite F32", with_tensor("fc.1.bias", struct.pack("<10f", *[0.0] * 9, -inf)),
             "fc.1.bias"),
        ]
        self.expect_rows([(label, valid(tensors=bad), f"corrupt: impossible contents: tensor "
                           f"'{name}' holds NaN or an infinity (dptrain never saves the weights "
                           "of a non-finite step); not used") for label, bad, name in rows])
        variance = with_tensor("1.running_var", struct.pack("<4f", 1.0, -0.0, -0.5, 2.0))
        self.expect_rows([("a negative variance", valid(tensors=variance),
                           "corrupt: impossible contents: tensor '1.running_var' (a BatchNorm "
                           "running variance) holds -0.5 (a variance is >= 0); not used")])
        # In dptrain's own file a tensor of another dtype is refused before its values are read.
        self.expect_rows([("a BF16 NaN", valid(tensors=with_tensor("0.bias", b"\xc0\x7f" * 4,
                                                                   "BF16")),
                           "tensor '0.bias' is BF16[4], the width-4 model's is F32[4]; not read")])
        # -0 and a negative running mean are a run's own.
        fine = with_tensor("1.running_var", struct.pack("<4f", -0.0, 1.0, 1.0, 1.0))
        fine = [(n, d, s, struct.pack("<4f", -3.0, 0, 0, 0) if n == "1.running_mean" else r)
                for n, d, s, r in fine]
        code, _, err = self.run_script(self.write("fine.safetensors", valid(tensors=fine)))
        self.assertEqual(code, 0, err)

    def test_tensors_other_than_the_models_are_refused_naming_the_first(self):
        """Note [A state dict from PyTorch is read as PyTorch reads it] in checkpoint.cpp: in
        dptrain's own files the tensors are exactly the model's (the same words as dptrain)."""
        model = st.model_tensors()
        self.expect_rows([
            ("one missing", valid(tensors=[t for t in model if t[0] != "1.running_mean"]),
             "has no tensor '1.running_mean' of the width-4 model; not read"),
            ("the buffers missing", valid(tensors=[t for t in model if t[0].endswith(
                ("weight", "bias"))]),
             "has no tensor '1.running_mean' of the width-4 model (nor 50 more); not read"),
            ("one extra", valid(tensors=model + [("\x1b[2Jextra", "F32", [1], b"\0" * 4)]),
             "holds tensor '\\x1b[2Jextra', which the width-4 model has not; not read"),
            ("another shape", valid(tensors=[
                (n, d, [11], b"\0" * 44) if n == "fc.1.bias" else (n, d, s, r)
                for n, d, s, r in model]),
             "tensor 'fc.1.bias' is F32[11], the width-4 model's is F32[10]; not read"),
            ("an F64 tensor", valid(tensors=with_tensor("0.bias", b"\0" * 32, "F64")),
             "tensor '0.bias' is F64[4], the width-4 model's is F32[4]; not read"),
        ])

    def test_ctrl_c_is_one_line_and_status_130(self):
        # A FIFO given to Python's own open() would block, but the script never waits on one:
        # Ctrl-C is sent while it reads a large sparse file's data instead.
        size = 2**29
        head = header_with({"w": entry("F32", [size // 4], 0, size)},
                           metadata={**st.metadata_of(st.valid_state()), "dptrain.width": "512"})
        path = self.write("slow.safetensors", head)
        os.truncate(path, len(head) + size)
        code = ("import os, signal, runpy, sys\n"
                "real = os.preadv\n"
                "def interrupted(*a):\n"
                "    os.kill(os.getpid(), signal.SIGINT)\n"
                "    return real(*a)\n"
                "os.preadv = interrupted\n"
                f"sys.argv = [{SCRIPT!r}, {path!r}]\n"
                f"runpy.run_path({SCRIPT!r}, run_name='__main__')\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                              timeout=TIMEOUT_S)
        self.assertEqual(done.stderr.decode(), "error: interrupted; nothing was written\n")
        self.assertEqual(done.returncode, 130)


class Issue51(ScriptTest):
    """The fourth hostile round: figures no run produces, metadata that contradicts the run
    state, widths no run has (each as dptrain refuses it, tests/train/test_checkpoint.cpp)."""

    def test_efficiency_figures_no_run_produces_are_refused(self):
        def stats(index, **kw):
            return lambda s: s["history"][index].update(**kw)
        nan, inf = float("nan"), float("inf")
        at = "corrupt: impossible contents: epoch 1 of the history: "
        self.expect_rows([(label, valid(edit), at + why) for label, edit, why in [
            ("-5 TFLOP/s", stats(0, tflops=-5.0),
             "TFLOP/s is -5 (nan, or from 0 to 200000: 100000 a device, in a world of 2)"),
            ("1e300 TFLOP/s", stats(0, tflops=1e300), "TFLOP/s is 1e+300 (nan, or from 0 to "
             "200000: 100000 a device, in a world of 2)"),
            ("an MFU of 1e300", stats(0, mfu=1e300),
             "MFU is 1e+300 (nan, or a fraction from 0 to 1)"),
            ("an MFU just above 1", stats(0, mfu=math.nextafter(1.0, 2.0)),
             "MFU is 1 (nan, or a fraction from 0 to 1)"),
            ("an MFU of no TFLOP/s", stats(0, tflops=nan, mfu=0.5),
             "MFU is 0.5 (of nan TFLOP/s: nan)"),
            ("a peak of -1 bytes", stats(0, peak_host_bytes=-1.0),
             "peak host bytes is -1 (nan, or a whole number of bytes from 0 to 2^50)"),
            ("a peak of 1e300 bytes", stats(0, peak_host_bytes=1e300),
             "peak host bytes is 1e+300 (nan, or a whole number of bytes from 0 to 2^50)"),
            ("an infinite peak", stats(0, peak_device_bytes=inf),
             "peak device bytes is inf (nan, or a whole number of bytes from 0 to 2^50)"),
            ("half a byte", stats(0, peak_device_bytes=0.5),
             "peak device bytes is 0.5 (nan, or a whole number of bytes from 0 to 2^50)"),
            ("-1 GPU ms", stats(0, gpu_ms_per_step=-1.0),
             "GPU milliseconds per step is -1 (nan, or from 0 to 1000000000000)"),
            ("an infinite accuracy", stats(0, train_acc=inf),
             "train accuracy is inf (nan, or an accuracy from 0 to 1)"),
            ("a validation accuracy above 1", stats(0, val_acc=1.5),
             "validation accuracy is 1.5 (nan, or an accuracy from 0 to 1)"),
            ("a negative validation loss", stats(0, val_loss=-0.5),
             "validation loss is -0.5 (a loss: >= 0, inf or nan)"),
            ("-1 evaluation seconds", stats(0, eval_seconds=-1.0),
             "evaluation seconds is -1 (nan, or from 0 to 1000000000)"),
            ("a run of 0 epochs", stats(0, epochs=0),
             "the run's epochs is 0 (from its number, 1, to 1000000)"),
            ("a run of 10^6 + 1 epochs", stats(0, epochs=1000001),
             "the run's epochs is 1000001 (from its number, 1, to 1000000)"),
        ]])

    def test_what_the_writer_leaves_nan_and_the_edges_are_read(self):
        nan = float("nan")

        def edit(s):
            s["history"][0].update(train_loss=nan, train_acc=nan, images_per_second=nan,
                                   gpu_ms_per_step=0.0, tflops=200000.0, mfu=1.0,
                                   peak_host_bytes=float(2**50), peak_device_bytes=0.0, epochs=1)
        path = self.write("edges.safetensors", valid(edit))
        code, out, err = self.run_script(path, "--json")
        self.assertEqual((code, err), (0, ""))
        first = json.loads(out)["history"][0]
        self.assertEqual([first[k] for k in ("train_loss", "train_acc", "images_per_second",
                                             "tflops", "mfu", "peak_host_bytes", "epochs")],
                         ["nan", "nan", "nan", 200000.0, 1.0, float(2**50), 1])

    def test_metadata_that_contradicts_the_run_state_is_refused(self):
        def meta(key, value):
            return lambda m: m.__setitem__(key, value)
        self.expect_rows([(label, valid(edit_metadata=edit), f"corrupt: metadata {why}")
                          for label, edit, why in [
            ("width 64", meta("dptrain.width", "64"),
             'dptrain.width is "64" where the run state gives "4"'),
            ("width 04", meta("dptrain.width", "04"),
             'dptrain.width is "04" where the run state gives "4"'),
            ("classes", meta("dptrain.num_classes", "1000"),
             'dptrain.num_classes is "1000" where the run state gives "10"'),
            ("channels", meta("dptrain.in_channels", "3"),
             'dptrain.in_channels is "3" where the run state gives "1"'),
            ("epochs done", meta("dptrain.epochs_done", "90"),
             'dptrain.epochs_done is "90" where the run state gives "2"'),
            ("digest", meta("dptrain.train_digest", "\x1b[2J" + "d" * 60),
             'dptrain.train_digest is "\\x1b[2J' + "d" * 60 + '" where the run state gives "5f0c'
             + "d" * 60 + '"'),
            ("test accuracy 0.9999", meta("dptrain.test_acc", "0.9999"),
             'dptrain.test_acc is "0.9999" where the run state gives "0.5"'),
            ("test accuracy with a space", meta("dptrain.test_acc", " 0.5"),
             'dptrain.test_acc is " 0.5" where the run state gives "0.5"'),
            ("test accuracy in Python's spelling", meta("dptrain.test_acc", "0_5"),
             'dptrain.test_acc is "0_5" where the run state gives "0.5"'),
        ]])
        # The same accuracy in another JSON spelling, or a key left out, says nothing false.
        for label, edit in [("5e-1", meta("dptrain.test_acc", "5e-1")),
                            ("0.50", meta("dptrain.test_acc", "0.50")),
                            ("no width", lambda m: m.pop("dptrain.width"))]:
            with self.subTest(label):
                code, _, err = self.run_script(self.write("same.safetensors",
                                                          valid(edit_metadata=edit)))
                self.assertEqual((code, err), (0, ""))

        # No finished epoch: no last test accuracy.
        def fresh(s):
            s.update(epochs_done=0, global_step=3, history=[])
        self.expect_rows([("no epoch", valid(fresh, meta("dptrain.test_acc", "0.9")),
                           'corrupt: metadata dptrain.test_acc is "0.9" where the run state '
                           "gives none (no epoch is finished)")])

    def test_a_width_no_run_has_is_corrupt(self):
        def width(w):
            def edit(s):
                s["config"]["width"] = w
            return edit
        self.expect_rows([(str(w), valid(width(w)), "corrupt: impossible contents: width is "
                           f"{shown} (dptrain writes 1 to 4096)")
                          for w, shown in ((0, "0"), (-4, "-4"), (2**63 - 1, "9223372036854775807"))])


class ValidFile(ScriptTest):
    def test_json_digests_summary_and_in_process(self):
        for kind, unpadded in (("checkpoint", False), ("model", True)):
            with self.subTest(kind=kind):
                path = self.write(f"{kind}.safetensors",
                                  st.checkpoint(st.valid_state(), st.model_tensors(), kind=kind,
                                                pad=not unpadded))
                code, out, err = self.run_script(path, "--json")
                self.assertEqual((code, err), (0, ""))
                self.assertEqual(json.loads(out), expected_json(st.valid_state(), kind))
                code, out, err = self.run_script(path, "--tensor-digests")
                self.assertEqual((code, err), (0, ""))
                names = {"F32": "float32", "I64": "int64", "F64": "float64", "BF16": "bfloat16",
                         "F16": "float16"}
                self.assertEqual(out.splitlines(), [
                    f"{name} {names[dtype]} {'x'.join(map(str, dims)) or 'scalar'} "
                    f"{hashlib.sha256(raw).hexdigest()}"
                    for name, dtype, dims, raw in st.model_tensors()])
                code, out, err = self.run_script(path)
                self.assertEqual(out, f"{path}: format 3 {kind}, width 4, batch 32, lr 0.05, "
                                 "seed 18446744073709551609, world 2; epoch 2 step 3 (global "
                                 "step 19); 2 epochs of history, 127 tensors\n")
                read = load_script().read_checkpoint(path, load_tensors=False)
                self.assertEqual([(n, d, s, r) for n, d, s, r in read["tensors"]],
                                 [(n, names[d], s, r) for n, d, s, r in st.model_tensors()])

    def test_safetensors_the_script_and_its_fallback_give_the_same_state_dict(self):
        # Every dtype a file may hold, in-process without the model check (check_model=False).
        path = self.write("good.safetensors", valid(tensors=st.valid_tensors()))
        standard = load_file(path)
        self.assertEqual(list(standard), ["w", "n", "empty", "h", "f"])
        self.assertEqual(standard["w"].tolist(), [1.5, -2.0, 3.25])
        self.assertEqual(standard["n"].item(), 42)
        self.assertEqual(list(standard["empty"].shape), [0, 3])
        self.assertEqual(standard["h"].float().tolist(), [[1.0], [2.0]])
        self.assertEqual(standard["f"].dtype, torch.float16)
        module = load_script()
        with_library = module.read_checkpoint(path, check_model=False)["state_dict"]
        kept = sys.modules["safetensors.torch"]
        sys.modules["safetensors.torch"] = None  # `from safetensors.torch import` now fails
        try:
            fallback = module.read_checkpoint(path, check_model=False)["state_dict"]
        finally:
            sys.modules["safetensors.torch"] = kept
        for label, states in (("with safetensors", with_library), ("fallback", fallback)):
            with self.subTest(label):
                self.assertEqual(list(states), list(standard))
                for name in standard:
                    self.assertEqual(states[name].dtype, standard[name].dtype)
                    self.assertTrue(torch.equal(states[name], standard[name]), name)

    def test_a_diverged_run_reads_with_nan_and_inf_as_strings(self):
        def diverged(state):
            state["history"][1]["train_loss"] = float("inf")
            state["history"][1]["test_loss"] = float("nan")
            state["partial_sums"]["loss_sum"] = float("inf")
        path = self.write("diverged.safetensors", valid(diverged))
        code, out, err = self.run_script(path, "--json")
        self.assertEqual((code, err), (0, ""))
        self.assertNotIn("NaN", out)
        self.assertNotIn("Infinity", out)
        read = json.loads(out)
        self.assertEqual((read["history"][1]["train_loss"], read["history"][1]["test_loss"],
                          read["partial_sums"]["loss_sum"]), ("inf", "nan", "inf"))

    def test_names_are_escaped_in_errors_and_the_summary(self):
        self.expect_rows([(name, valid(tensors=st.model_tensors() + [(name, "F32", [1], b"\0" * 4)]),
                           f"holds tensor '{shown}', which the width-4 model has not; not read")
                          for name, shown in [("\x1b[2Jwiped", "\\x1b[2Jwiped"),
                                              ("caf\u00e9", "caf\\xc3\\xa9"),
                                              ("back\\slash", "back\\\\slash")]])
        self.expect_rows([("a title in a dtype error",
                           header_with({"\x1b]0;owned\x07": entry("Q8", [1], 0, 1)}, data=b"\0"),
                           "tensor '\\x1b]0;owned\\x07' has dtype \"Q8\"; dptrain reads F32, "
                           "F64, I64, BF16 and F16")])
        path = self.write("a\x1b[1mb.safetensors", valid())
        code, out, err = self.run_script(path)
        self.assertEqual((code, err), (0, ""))
        self.assertTrue(out.startswith(path.replace("\x1b", "\\x1b") + ": format 3"), out)

    def test_a_full_standard_output_is_one_error_line(self):
        path = self.write("good.safetensors", valid())
        with open("/dev/full", "wb") as full:
            code, _, err = self.run_script(path, stdout=full)
        self.assertEqual(err, "error: cannot write to standard output: No space left on device\n")
        self.assertEqual(code, 1)


# ---- Mutations: every byte changed, every length cut -----------------------------------------

def refit_digest(data):
    """`data` with its digest made to fit its (mutated) contents, where its header still parses,
    so that a mutation reaches the run-state checks; else None."""
    try:
        n = struct.unpack_from("<Q", data)[0]
        header = json.loads(bytes(data[8:8 + n]))
        metadata = header["__metadata__"]
        entries = sorted((e["data_offsets"], name, e) for name, e in header.items()
                         if name != "__metadata__")
        tensors = [(name, e["dtype"], e["shape"], bytes(data[8 + n + b:8 + n + end]))
                   for (b, end), name, e in entries]
        metadata["dptrain.digest"] = st.digest(metadata, tensors)
        return st.layout(header, bytes(data[8 + n:]), pad=False)
    except Exception:  # noqa: BLE001  (a mutant beyond refitting is tried only as it is)
        return None


def mutations(data):
    """Deterministic: each byte with each bit flipped, set to 0xff and to 0, and each prefix;
    each as it is (the digest turns nearly all away) and with the digest refitted."""
    for at in range(len(data)):
        for value in [data[at] ^ (1 << bit) for bit in range(8)] + [0xFF, 0x00]:
            if value != data[at]:
                mutant = data[:at] + bytes([value]) + data[at + 1:]
                yield mutant
                if at >= 8:
                    yield refit_digest(mutant)
    for size in range(len(data)):
        yield data[:size]


class Mutations(ScriptTest):
    """The script's parser gets fuzz_checkpoint's treatment, deterministically: every mutant of a
    small valid file is read or refused in one line, and so are the fuzzer's seeds."""

    def test_every_mutation_is_read_or_refused_in_one_line(self):
        tensors = [("w", "F32", [2], struct.pack("<2f", 1.5, -2.0)), ("n", "I64", [], b"\0" * 8)]
        state = st.valid_state()
        state.update(epochs_done=0, global_step=3, history=[])  # a short run state
        self.check_mutants_of(st.checkpoint(state, tensors))

    def test_the_fuzz_corpus_is_read_or_refused_in_one_line(self):
        module = load_script()
        seeds = sorted(os.listdir(CORPUS))
        self.assertIn("valid_mid_epoch.safetensors", seeds)
        for seed in seeds:
            with self.subTest(seed):
                with open(os.path.join(CORPUS, seed), "rb") as f:
                    data = f.read()
                path = self.write(seed, data)
                self.assertIsNone(self.problem_with(module, path))
                # The version-3 valid seeds are read; the DPTRNCKP ones are dptrain's alone.
                self.assertEqual(self.last_accepted,
                                 seed.startswith("valid_") and seed.endswith(".safetensors"))

    def check_mutants_of(self, data):
        module = load_script()
        path = self.path("mutant.safetensors")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # one descriptor: no flush per mutant
        problems, tried, accepted, started = {}, 0, 0, time.monotonic()
        try:
            for mutant in mutations(data):
                if mutant is None:
                    continue
                os.ftruncate(fd, len(mutant))
                os.pwrite(fd, mutant, 0)
                problem = self.problem_with(module, path)
                if problem:
                    count, example = problems.get(problem, (0, mutant.hex()))
                    problems[problem] = (count + 1, example)
                accepted += problem is None and self.last_accepted
                tried += 1
        finally:
            os.close(fd)
        if problems:
            self.fail("\n".join(f"{count} of {tried} mutants: {problem}; the first: {example}"
                                 for problem, (count, example) in problems.items()))
        self.assertLess(time.monotonic() - started, 150.0)
        self.assertGreater(accepted, 0)  # the refitted flips of tensor bytes, at least
        self.assertGreater(tried, 10 * len(data))

    def problem_with(self, module, path):
        """None when the script read the file (and its tensors convert) or refused it in one
        printable line naming the file; else what went wrong."""
        self.last_accepted = False
        try:
            result = module.read_checkpoint(path, check_model=False)
            json.dumps(module.json_figures({k: v for k, v in result.items()
                                            if k not in ("tensors", "state_dict")}),
                       allow_nan=False)
        except module.CheckpointError as e:
            message = str(e)
            if not message.startswith(f"checkpoint {path}: "):
                return "a message that does not start 'checkpoint PATH: '"
            if not all(" " <= ch <= "~" for ch in message):
                return "a message with a character that is not printable ASCII"
            return None
        except Exception as e:  # noqa: BLE001  (any other exception is the bug looked for)
            return f"{type(e).__name__}: {e} (a traceback)"
        self.last_accepted = True
        return None


def write_results(result, path):
    """The suite's skips in GoogleTest's XML shape, for tests/check_skips.py: CTest sees only the
    exit status, which is 0 however many tests skipped."""
    from xml.sax.saxutils import quoteattr
    cases = []
    for test, reason in result.skipped:
        *_, case, name = test.id().split(".")
        suite = f"ReadCheckpointScript.{case}"
        cases.append(f'<testcase name={quoteattr(name)} classname={quoteattr(suite)} '
                     f'result="skipped"><skipped message={quoteattr(reason)}/></testcase>')
    with open(path, "w", encoding="utf-8") as out:
        out.write(f'<testsuites><testsuite name="read_checkpoint" tests="{result.testsRun}">'
                  f'{"".join(cases)}</testsuite></testsuites>\n')


if __name__ == "__main__":
    program = unittest.main(exit=False)
    if os.environ.get("DPTRAIN_TEST_RESULTS_DIR"):
        os.makedirs(os.environ["DPTRAIN_TEST_RESULTS_DIR"], exist_ok=True)
        write_results(program.result, os.path.join(os.environ["DPTRAIN_TEST_RESULTS_DIR"],
                                                   "ReadCheckpointScript.xml"))
    sys.exit(0 if program.result.wasSuccessful() else 1)
