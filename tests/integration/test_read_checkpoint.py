#!/usr/bin/env python3
"""scripts/read_checkpoint.py against hostile files. Each row builds a file (or an output target)
and names the one error line and the exit status the script must give, run as a subprocess with
a 20 s limit (a hang fails) and, unless torch is loaded, 1 GiB of address space (a whole-file
read of a 4 GiB file fails). Then a valid file's round trip, and a deterministic mutation test of
the parser in-process. Torch is needed only where --save-state-dict writes (skipped without it).

    /usr/bin/python3 tests/integration/test_read_checkpoint.py [-v]
    READ_CHECKPOINT_SCRIPT=/tmp/old.py /usr/bin/python3 tests/integration/test_read_checkpoint.py  # a copy

The checkpoints are written by the small serialiser below, independent of the script's reader;
the format is lib/include/dptrain/train/checkpoint.h's.
"""
import importlib.util
import json
import os
import resource
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.environ.get("READ_CHECKPOINT_SCRIPT") or os.path.join(HERE, "..", "..", "scripts",
                                                                  "read_checkpoint.py")
TIMEOUT_S = 20  # per run of the script: far above its real time, far below a test's limit
MEMORY_BYTES = 1 << 30  # a run without torch needs a few tens of MiB

try:
    import torch
except ImportError:
    torch = None


def load_script():
    sys.dont_write_bytecode = True  # no __pycache__ beside the script
    spec = importlib.util.spec_from_file_location("read_checkpoint_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- A serialiser of the format, with the offsets the reader's messages give ----------------

CONFIG_FIELDS = ("width", "num_classes", "in_channels", "batch_size", "lr", "seed", "train_size",
                 "world_size")
STATS_FIELDS = ("epoch", "epochs", "train_loss", "train_acc", "test_loss", "test_acc", "seconds",
                "images_per_second", "steps")
DTYPE_CODES = {"float32": 1, "float64": 2, "int64": 3, "bfloat16": 4, "float16": 5}


class Writer:
    """Little-endian fields; `marks` keeps the offset after chosen fields, as the reader names
    the offset after the field it refuses ("at byte N", counted from the payload's start)."""

    def __init__(self):
        self.data, self.marks = bytearray(), {}

    def put(self, layout, *values, mark=None):
        self.data += struct.pack("<" + layout, *values)
        if mark:
            self.marks[mark] = len(self.data)

    def text(self, value, mark):
        raw = value if isinstance(value, bytes) else value.encode()
        self.put("Q", len(raw), mark=mark)
        self.data += raw


def payload_of(c, history_count=None, tensor_count=None):
    """The payload of checkpoint dict `c` (read_checkpoint's shape). A tensor is (name, dtype,
    dims, raw[, stored byte count]); a name may be bytes and a dtype a bare code, for the rows
    that need what dptrain never writes."""
    w, cfg = Writer(), c["config"]
    w.put("qqqqdQqq", *(cfg[k] for k in CONFIG_FIELDS))
    if c["format_version"] >= 2:
        w.text(cfg["train_digest"], "digest")
    w.put("qqq", c["epochs_done"], c["step_in_epoch"], c["global_step"])
    sums = c["partial_sums"]
    w.put("dddd", sums["loss_sum"], sums["correct"], sums["count"], c["partial_seconds"])
    w.put("Q", len(c["history"]) if history_count is None else history_count, mark="history")
    for stats in c["history"]:
        w.put("qqddddddq", *(stats[k] for k in STATS_FIELDS))
    w.marks["contents"] = len(w.data)  # where the contents are checked: after the history
    w.put("Q", len(c["tensors"]) if tensor_count is None else tensor_count, mark="tensors")
    for i, (name, dtype, dims, raw, *stored) in enumerate(c["tensors"]):
        w.text(name, f"t{i}.name")
        w.put("I", DTYPE_CODES.get(dtype, dtype), mark=f"t{i}.code")
        w.put("Q", len(dims), mark=f"t{i}.rank")
        for d, size in enumerate(dims):
            w.put("q", size, mark=f"t{i}.dim{d}")
        w.put("Q", stored[0] if stored else len(raw), mark=f"t{i}.stored")
        w.data += raw
    return w


def with_header(version, payload, size=None):
    """Version 1's CRC-32 covers the payload; later versions' the magic, version and size too."""
    head = b"DPTRNCKP" + struct.pack("<IQ", version, len(payload) if size is None else size)
    crc = zlib.crc32(payload) if version == 1 else zlib.crc32(head + payload)
    return head + struct.pack("<I", crc) + bytes(payload)


def serialise(c, **counts):
    return with_header(c["format_version"], payload_of(c, **counts).data)


def refit_header(data):
    """`data` with its header's payload size and CRC made to fit the rest (fuzz_checkpoint.cpp's
    second try), so that a mutation reaches the payload's parser."""
    version = struct.unpack_from("<I", data, 8)[0]
    head = bytes(data[:12]) + struct.pack("<Q", len(data) - 24)
    payload = bytes(data[24:])
    crc = zlib.crc32(payload) if version == 1 else zlib.crc32(head + payload)
    return head + struct.pack("<I", crc) + payload


def epoch(i):
    return {"epoch": i, "epochs": 7, "train_loss": 2.302585092994046 / i, "train_acc": 0.1 * i,
            "test_loss": -0.0, "test_acc": 0.5, "seconds": 1e-300, "images_per_second": 6.02e23,
            "steps": 8}


def valid():
    """A small checkpoint in which every field is consistent: 256 images in batches of 32 are
    8 steps an epoch, so epoch 3 step 3 is global step 19. Every dtype, a scalar, an empty."""
    return {
        "format_version": 2,
        "config": {"width": 4, "num_classes": 10, "in_channels": 1, "batch_size": 32,
                   "lr": 0.05, "seed": 2**64 - 7, "train_size": 256, "world_size": 2,
                   "train_digest": "5f0c" + "d" * 60},
        "epochs_done": 2, "step_in_epoch": 3, "global_step": 19,
        "partial_sums": {"loss_sum": 6.5, "correct": 40.0, "count": 96.0},
        "partial_seconds": 0.25,
        "history": [epoch(1), epoch(2)],
        "tensors": [("w", "float32", [3], struct.pack("<3f", 1.5, -2.0, 3.25)),
                    ("n", "int64", [], struct.pack("<q", 42)),
                    ("empty", "float64", [0, 3], b""),
                    ("h", "bfloat16", [2, 1], b"\x80\x3f\x00\x40"),  # 1.0, 2.0
                    ("f", "float16", [2], struct.pack("<2e", 0.5, -1.0))],
    }


def changed(change):
    """valid() with `change` applied to it (a function that edits the dict in place)."""
    c = valid()
    change(c)
    return c


# ---- Running the script --------------------------------------------------------------------

def limits(memory, file_size):
    def apply():
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
        if file_size is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    return apply


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

    def run_script(self, *args, memory=True, file_size=None, stdout=subprocess.PIPE):
        """(exit status, stdout, stderr) of the script on `args`; a run past TIMEOUT_S fails."""
        try:
            done = subprocess.run([sys.executable, SCRIPT, *args], stdout=stdout,
                                  stderr=subprocess.PIPE, timeout=TIMEOUT_S,
                                  preexec_fn=limits(memory, file_size))
        except subprocess.TimeoutExpired:
            self.fail(f"read_checkpoint.py {' '.join(args)}: still running after {TIMEOUT_S} s")
        out = done.stdout.decode(errors="backslashreplace") if done.stdout is not None else ""
        return done.returncode, out, done.stderr.decode(errors="backslashreplace")

    def expect_error(self, args, line, status=1, **run):
        """The script prints exactly `line` (and "error: " before it) to stderr, nothing to
        stdout, and exits with `status`."""
        code, out, err = self.run_script(*args, **run)
        self.assertEqual(err, f"error: {line}\n")
        self.assertEqual(out, "")
        self.assertEqual(code, status, err)

    def expect_rows(self, rows):
        """Rows of (label, file name, bytes, extra args, expected line given the path)."""
        for label, name, data, args, line in rows:
            with self.subTest(label):
                path = self.write(name, data)
                self.expect_error([path, *args], line(path))


# ---- 1: only regular files, without waiting ------------------------------------------------

def first_block_device():
    for name in sorted(os.listdir("/dev")):
        try:
            if stat.S_ISBLK(os.stat(os.path.join("/dev", name)).st_mode):
                return os.path.join("/dev", name)
        except OSError:
            continue
    return None


class NonRegularPaths(ScriptTest):
    def test_are_refused_at_once_naming_the_kind(self):
        fifo, directory, sock = self.path("fifo.dpt"), self.path("dir.dpt"), self.path("sock.dpt")
        os.mkfifo(fifo)  # no writer ever comes: an open that waits for one hangs
        os.mkdir(directory)
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(sock)
        rows = [(fifo, "a FIFO"), (directory, "a directory"), ("/dev/null", "a character device"),
                (sock, "a socket"), (first_block_device(), "a block device")]
        for path, kind in rows:
            with self.subTest(kind):
                if path is None:
                    self.skipTest("no block device in /dev")
                self.expect_error([path], f"checkpoint {path}: not a regular file ({kind})")

    def test_a_missing_file_cannot_be_opened(self):
        path = self.path("missing.dpt")
        self.expect_error([path], f"checkpoint {path}: cannot open: No such file or directory")


# ---- 2: the header first; no payload read beyond what it declares and the file holds --------

class Sizes(ScriptTest):
    def test_a_payload_over_4_gib_is_refused_unread(self):
        path = self.write("huge.dpt", b"DPTRNCKP" + struct.pack("<IQI", 2, 2**32, 0))
        os.truncate(path, 24 + 2**32)  # sparse: 4 GiB that occupy no disk
        if os.stat(path).st_blocks * 512 > 1 << 20:
            self.skipTest("this file system has no sparse files")
        self.expect_error([path], f"checkpoint {path}: payload of 4294967296 bytes is larger "
                          "than dptrain writes")

    def test_a_file_larger_than_its_model_is_refused_unread(self):
        # lib/src/train/checkpoint.cpp's checkpoint_size_limit(width 4, 10 classes, 1 channel, 10^6
        # epochs): 264 bytes of settings, 72,000,000 of history, 1000 tensors' headers of 4,188,
        # 8 bytes for each of the 51,752 elements a width-4 ResNet-18 has at most.
        limit = 264 + 72000000 + 8 + 1000 * 4188 + 8 * 51752
        c = valid()
        head = bytes(with_header(2, payload_of(c).data)[:24 + 64])
        path = self.write("bloated.dpt", head[:12] + struct.pack("<Q", limit + 1 - 24) + head[20:])
        os.truncate(path, limit + 1)
        self.expect_error([path], f"checkpoint {path}: {limit + 1} bytes, more than a checkpoint "
                          f"of a width-4 model can hold (at most {limit}); not read")

    def test_the_declared_size_must_be_the_files(self):
        good = serialise(valid())
        promised = len(good) - 24
        rows = [
            ("padded", "padded.dpt", good + b"xyz", [], lambda p: f"checkpoint {p}: truncated or "
             f"padded: the header promises {promised} bytes of payload, the file has "
             f"{promised + 3}"),
            ("cut", "cut.dpt", good[:-5], [], lambda p: f"checkpoint {p}: truncated or padded: "
             f"the header promises {promised} bytes of payload, the file has {promised - 5}"),
            ("a terabyte promised", "tb.dpt", with_header(2, good[24:], size=2**40), [],
             lambda p: f"checkpoint {p}: truncated or padded: the header promises "
             f"1099511627776 bytes of payload, the file has {promised}"),
            ("cut in the header", "head.dpt", good[:16], [],
             lambda p: f"checkpoint {p}: truncated: needs 8 more bytes at byte 12 of 16"),
        ]
        self.expect_rows(rows)


# ---- 3 and 4: every parse failure one CheckpointError line, never a traceback --------------

def tensor_rows():
    """(label, checkpoint dict, counts, expected corrupt/truncated message given the marks)."""
    def first_tensor(*fields):
        return lambda c: c["tensors"].__setitem__(0, fields)
    huge = 2**62
    return [
        ("name not UTF-8", first_tensor(b"w\xff", "float32", [1], b"\0" * 4), {},
         lambda m: f"corrupt: tensor name is not UTF-8 at byte {m['t0.name']}"),
        ("name an overlong encoding", first_tensor(b"\xc0\xaf", "float32", [1], b"\0" * 4), {},
         lambda m: f"corrupt: tensor name is not UTF-8 at byte {m['t0.name']}"),
        ("digest not UTF-8", lambda c: c["config"].__setitem__("train_digest", b"\xed\xa0\x80"),
         {}, lambda m: f"corrupt: training-set digest is not UTF-8 at byte {m['digest']}"),
        ("name of 4097 bytes", first_tensor("n" * 4097, "float32", [1], b"\0" * 4), {},
         lambda m: f"corrupt: tensor name of 4097 bytes at byte {m['t0.name']}"),
        ("digest of 129 bytes", lambda c: c["config"].__setitem__("train_digest", "a" * 129), {},
         lambda m: f"corrupt: training-set digest of 129 bytes at byte {m['digest']}"),
        ("rank 9", first_tensor("w", "float32", [1] * 9, b"\0" * 4), {},
         lambda m: f"corrupt: tensor w of rank 9 at byte {m['t0.rank']}"),
        ("100001 tensors", lambda c: None, {"tensor_count": 100001},
         lambda m: f"corrupt: 100001 tensors at byte {m['tensors']}"),
        ("1000001 epochs", lambda c: None, {"history_count": 1000001},
         lambda m: f"corrupt: history of 1000001 epochs at byte {m['history']}"),
        ("1000 epochs in a smaller file", lambda c: None, {"history_count": 1000},
         lambda m: f"corrupt: history of 1000 epochs at byte {m['history']}"),
        ("shape of 3, data of 2 floats", first_tensor("w", "float32", [3], b"\0" * 8), {},
         lambda m: f"corrupt: tensor w holds 8 bytes, its shape 3 elements at byte "
         f"{m['t0.stored']}"),
        ("a byte count of 2^63", first_tensor("w", "float32", [3], b"", 2**63), {},
         lambda m: f"corrupt: tensor w holds 9223372036854775808 bytes, its shape 3 elements at "
         f"byte {m['t0.stored']}"),
        ("a shape past 2^64 elements", first_tensor("w", "float32", [huge, huge], b""), {},
         lambda m: f"corrupt: tensor w with bad dimension {huge} at byte {m['t0.dim1']}"),
        ("a shape larger than the file", first_tensor("w", "float32", [huge], b""), {},
         lambda m: f"corrupt: tensor w holds 0 bytes, its shape {huge} elements at byte "
         f"{m['t0.stored']}"),
        ("unknown dtype code", first_tensor("w", 9, [1], b"\0" * 4), {},
         lambda m: f"corrupt: unknown dtype code in tensor w at byte {m['t0.code']}"),
        ("a name twice", lambda c: c["tensors"].__setitem__(1, c["tensors"][0]), {},
         lambda m: f"corrupt: tensor w appears twice at byte {m['t2.name'] - 8}"),
        # 4: a negative dimension is refused, not read as an empty or huge tensor.
        ("dimension -1", first_tensor("w", "float32", [-1], b""), {},
         lambda m: f"corrupt: tensor w with bad dimension -1 at byte {m['t0.dim0']}"),
        ("dimensions 2, -3", first_tensor("w", "float32", [2, -3], b""), {},
         lambda m: f"corrupt: tensor w with bad dimension -3 at byte {m['t0.dim1']}"),
    ]


class ParseFailures(ScriptTest):
    def test_are_one_line_naming_the_file_and_the_byte(self):
        rows = []
        for label, change, counts, message in tensor_rows():
            w = payload_of(changed(change), **counts)
            rows.append((label, "bad.dpt", with_header(2, w.data), [],
                         lambda p, message=message, m=w.marks: f"checkpoint {p}: {message(m)}"))
        self.expect_rows(rows)

    def test_truncated_stray_damaged_and_newer_files(self):
        w = payload_of(valid())
        at = w.marks["t0.rank"]
        good = with_header(2, w.data)
        rows = [
            ("cut inside a tensor's shape", "cut.dpt", with_header(2, w.data[:at + 4]), [],
             lambda p: f"checkpoint {p}: truncated: needs 8 more bytes at byte {at} of {at + 4}"),
            ("a history longer than the file", "cut.dpt",
             with_header(2, w.data[:w.marks["history"] + 100]), [],
             lambda p: f"checkpoint {p}: corrupt: history of 2 epochs at byte "
             f"{w.marks['history']}"),
            ("stray bytes", "stray.dpt", with_header(2, w.data + b"abc"), [],
             lambda p: f"checkpoint {p}: corrupt: 3 stray bytes after the tensors at byte "
             f"{len(w.data)}"),
            ("a flipped bit", "flip.dpt", good[:100] + bytes([good[100] ^ 4]) + good[101:], [],
             lambda p: f"checkpoint {p}: corrupt: the CRC-32 does not match"),
            ("version 3", "v3.dpt", with_header(3, w.data), [],
             lambda p: f"checkpoint {p}: format version 3, written by a newer dptrain; this "
             "script reads versions 1 to 2"),
            ("version 0", "v0.dpt", with_header(0, w.data), [],
             lambda p: f"checkpoint {p}: format version 0, which no dptrain writes (corrupt or "
             "foreign)"),
            ("text", "notes.dpt", b"epoch 3, step 17\n", [],
             lambda p: f"checkpoint {p}: not a dptrain checkpoint (no DPTRNCKP header)"),
        ]
        self.expect_rows(rows)


# ---- 5: JSON output, and nothing raw from the file on the terminal -------------------------

class OutputSafety(ScriptTest):
    def test_non_finite_figures_are_refused_or_written_as_strings(self):
        def nan_lr(c):
            c["config"]["lr"] = float("nan")
        at = payload_of(valid()).marks["contents"]
        self.expect_rows([("lr nan", "nan.dpt", serialise(changed(nan_lr)), ["--json"],
                           lambda p: f"checkpoint {p}: corrupt: impossible contents: the "
                           f"learning rate is nan (a finite number > 0) at byte {at}")])

        # A run that diverged writes nan and inf losses: read, and kept JSON as strings.
        def diverged(c):
            c["history"][1]["train_loss"] = float("inf")
            c["history"][1]["test_loss"] = float("nan")
            c["partial_sums"]["loss_sum"] = float("inf")
        path = self.write("diverged.dpt", serialise(changed(diverged)))
        code, out, err = self.run_script(path, "--json")
        self.assertEqual((code, err), (0, ""))
        read = json.loads(out)  # json.loads takes NaN; check that none is there
        self.assertNotIn("NaN", out)
        self.assertNotIn("Infinity", out)
        self.assertEqual((read["history"][1]["train_loss"], read["history"][1]["test_loss"],
                          read["partial_sums"]["loss_sum"]), ("inf", "nan", "inf"))
        self.assertEqual(read["history"][0], epoch(1))

    def test_names_are_escaped_in_digests_errors_and_the_summary(self):
        names = ["\x1b[2Jwiped", "caf\u00e9", "back\\slash"]

        def rename(c):
            for i, name in enumerate(names):
                c["tensors"][i] = (name, *c["tensors"][i][1:])
        path = self.write("names.dpt", serialise(changed(rename)))
        code, out, err = self.run_script(path, "--tensor-digests")
        self.assertEqual((code, err), (0, ""))
        shown = [line.split(" ")[0] for line in out.splitlines()]
        self.assertEqual(shown, ["\\x1b[2Jwiped", "caf\\xc3\\xa9", "back\\\\slash", "h", "f"])

        w = payload_of(changed(lambda c: c["tensors"].__setitem__(
            0, ("\x1b]0;owned\x07", 9, [1], b"\0" * 4))))
        path = self.write("title.dpt", with_header(2, w.data))
        self.expect_error([path], f"checkpoint {path}: corrupt: unknown dtype code in tensor "
                          f"\\x1b]0;owned\\x07 at byte {w.marks['t0.code']}")

        path = self.write("a\x1b[1mb.dpt", serialise(valid()))
        code, out, err = self.run_script(path)
        self.assertEqual((code, err), (0, ""))
        self.assertTrue(out.startswith(path.replace("\x1b", "\\x1b") + ": format 2"), out)


class StandardOutput(ScriptTest):
    def test_a_full_device_is_one_error_line(self):
        path = self.write("good.dpt", serialise(valid()))
        with open("/dev/full", "wb") as full:
            code, _, err = self.run_script(path, stdout=full)
        self.assertEqual(err, "error: cannot write to standard output: No space left on device\n")
        self.assertEqual(code, 1)


# ---- 6: --save-state-dict writes a whole file or none, and nothing but a file ---------------

class SaveStateDict(ScriptTest):
    def refusal(self, target, kind):
        return (f"--save-state-dict {target}: is {kind}; read_checkpoint.py writes a new file "
                "or replaces a regular one, nothing else")

    def test_targets_other_than_files_are_refused_before_reading(self):
        source = self.write("good.dpt", serialise(valid()))
        fifo, directory, link = self.path("sd.fifo"), self.path("sd.dir"), self.path("sd.link")
        os.mkfifo(fifo)  # no reader ever comes: an open for writing that waits hangs
        os.mkdir(directory)
        kept = self.write("kept.pt", b"older")
        os.symlink(kept, link)
        rows = [("/dev/full", "a character device"), (fifo, "a FIFO"),
                (directory, "a directory"), (link, "a symbolic link")]
        for target, kind in rows:
            with self.subTest(kind):
                self.expect_error([source, "--save-state-dict", target],
                                  self.refusal(target, kind), status=2)
        with open(kept, "rb") as f:
            self.assertEqual(f.read(), b"older")

    @unittest.skipIf(torch is None, "no torch in this Python")
    def test_a_failed_write_is_one_line_and_leaves_nothing(self):
        source = self.write("good.dpt", serialise(valid()))
        os.mkdir(self.path("out"))
        older = self.write("out/sd.pt", b"older")
        rows = [("missing directory", self.path("missing/sd.pt"), None,
                 "No such file or directory"),
                ("file size limit", older, 512, "File too large")]  # torch.save's zip is larger
        for label, target, file_size, cause in rows:
            with self.subTest(label):
                self.expect_error([source, "--save-state-dict", target],
                                  f"--save-state-dict {target}: cannot write: {cause}",
                                  memory=False, file_size=file_size)
        self.assertEqual(os.listdir(self.path("out")), ["sd.pt"])  # no temporary left
        with open(older, "rb") as f:
            self.assertEqual(f.read(), b"older")

    @unittest.skipIf(torch is None, "no torch in this Python")
    def test_writes_a_state_dict_torch_loads(self):
        source = self.write("good.dpt", serialise(valid()))
        target = self.write("sd.pt", b"older")
        code, out, err = self.run_script(source, "--save-state-dict", target, memory=False)
        self.assertEqual((code, out, err), (0, "", ""))
        self.assertEqual(sorted(os.listdir(self.dir)), ["good.dpt", "sd.pt"])
        loaded = torch.load(target)
        self.assertEqual(list(loaded), ["w", "n", "empty", "h", "f"])
        self.assertEqual(loaded["w"].tolist(), [1.5, -2.0, 3.25])
        self.assertEqual(loaded["n"].item(), 42)
        self.assertEqual(list(loaded["empty"].shape), [0, 3])
        self.assertEqual(loaded["h"].float().tolist(), [[1.0], [2.0]])
        self.assertEqual(loaded["f"].dtype, torch.float16)


# ---- 8: contents dptrain cannot have written --------------------------------------------------

def impossible_rows():
    """(label, edit of valid(), expected "impossible contents" text): the C++ reader's words."""
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
        ("epochs_done -1", field("epochs_done", value=-1),
         "the epochs done is -1 (dptrain writes 0 to 1000000)"),
        ("epochs_done 10^6 + 1", field("epochs_done", value=1000001),
         "the epochs done is 1000001 (dptrain writes 0 to 1000000)"),
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
        ("images per second nan", field("history", 0, "images_per_second", value=nan),
         "epoch 1 of the history: images per second is nan (a finite number >= 0)"),
        ("steps -1", field("history", 1, "steps", value=-1),
         "epoch 2 of the history: steps is -1 (a finite number >= 0)"),
        ("accuracy 1.5", field("history", 0, "train_acc", value=1.5),
         "epoch 1 of the history: train accuracy is 1.5 (an accuracy from 0 to 1)"),
        ("accuracy nan", field("history", 1, "test_acc", value=nan),
         "epoch 2 of the history: test accuracy is nan (an accuracy from 0 to 1)"),
    ]


class ImpossibleContents(ScriptTest):
    def test_are_refused_naming_the_field_and_why(self):
        rows = []
        for label, edit, why in impossible_rows():
            w = payload_of(changed(edit))
            rows.append((label, "impossible.dpt", with_header(2, w.data), [],
                         lambda p, why=why, at=w.marks["contents"]:
                         f"checkpoint {p}: corrupt: impossible contents: {why} at byte {at}"))
        self.expect_rows(rows)


# ---- 9: archives are never opened ---------------------------------------------------------

class Archives(ScriptTest):
    def test_a_zip_is_refused_without_opening_it(self):
        with zipfile.ZipFile(self.path("model.pt"), "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02cos\nsystem\n.")  # what an unpickler runs
        path = self.path("model.pt")
        self.expect_error([path], f"checkpoint {path}: a zip archive (TorchScript or torch.save; "
                          "--save-model wrote these before it wrote checkpoints), not a dptrain "
                          "checkpoint; this reader never opens archives, because loading one "
                          "runs the code it may carry")


# ---- A valid file, whole ------------------------------------------------------------------

def digest_lines(c):
    import hashlib
    return [f"{name} {dtype} {'x'.join(map(str, dims)) or 'scalar'} "
            f"{hashlib.sha256(raw).hexdigest()}" for name, dtype, dims, raw in c["tensors"]]


class ValidFile(ScriptTest):
    """The output for a valid file is what it was before the hardening: these pass on both."""

    def test_round_trip_json_digests_summary_and_in_process(self):
        for version in (2, 1):
            with self.subTest(version=version):
                c = valid()
                c["format_version"] = version
                if version == 1:
                    c["config"]["train_digest"] = ""
                path = self.write(f"v{version}.dpt", serialise(c))
                expected = {k: v for k, v in c.items() if k != "tensors"}
                code, out, err = self.run_script(path, "--json")
                self.assertEqual((code, err), (0, ""))
                self.assertEqual(json.loads(out), expected)
                code, out, err = self.run_script(path, "--tensor-digests")
                self.assertEqual((code, err), (0, ""))
                self.assertEqual(out.splitlines(), digest_lines(c))
                code, out, err = self.run_script(path)
                self.assertEqual(out, f"{path}: format {version}, width 4, batch 32, lr 0.05, "
                                 "seed 18446744073709551609, world 2; epoch 2 step 3 (global "
                                 "step 19); 2 epochs of history, 5 tensors\n")
                read = load_script().read_checkpoint(path, load_tensors=False)
                self.assertEqual([tuple(t) for t in read["tensors"]], c["tensors"])
                self.assertEqual(serialise(read), serialise(c))


# ---- Mutations: every byte changed, every length cut --------------------------------------

def mutations(data):
    """Deterministic: each byte with each bit flipped, set to 0xff and to 0; each as it is (the
    CRC turns nearly all away) and with the header refitted (the payload parser sees them)."""
    for at in range(len(data)):
        for value in [data[at] ^ (1 << bit) for bit in range(8)] + [0xFF, 0x00]:
            if value != data[at]:
                changed_bytes = data[:at] + bytes([value]) + data[at + 1:]
                yield changed_bytes
                yield refit_header(changed_bytes)
    for size in range(len(data)):
        yield data[:size]
        if size >= 24:
            yield refit_header(data[:size])


CORPUS = os.path.join(HERE, "..", "..", "fuzz", "corpus", "fuzz_checkpoint")


class Mutations(ScriptTest):
    """The script's own parser gets fuzz_checkpoint's treatment, deterministically: its seeds are
    this file's valid() and the C++ fuzzer's corpus, and every mutant of each is read exactly or
    refused in one line."""

    def test_every_mutation_is_read_or_refused_in_one_line(self):
        self.check_mutants_of(serialise(valid()))

    def test_the_fuzz_corpus_and_its_mutants_are_read_or_refused_in_one_line(self):
        module = load_script()
        seeds = sorted(os.listdir(CORPUS))
        self.assertIn("valid_mid_epoch.dpt", seeds)
        for seed in seeds:
            with self.subTest(seed):
                with open(os.path.join(CORPUS, seed), "rb") as f:
                    data = f.read()
                path = self.write(seed, data)
                self.assertIsNone(self.problem_with(module, path, data))
                # The valid seeds are read, and their mutants tried like valid()'s.
                self.assertEqual(self.last_accepted, seed.startswith("valid_"))
                if self.last_accepted:
                    self.check_mutants_of(data)

    def check_mutants_of(self, data):
        module = load_script()
        path = self.path("mutant.dpt")
        # One descriptor for every mutant: truncating and closing a file each time is an ext4
        # flush (auto_da_alloc), 2 ms a mutant.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        problems, tried, accepted, started = {}, 0, 0, time.monotonic()
        try:
            for mutant in mutations(data):
                os.ftruncate(fd, len(mutant))
                os.pwrite(fd, mutant, 0)
                begun = time.monotonic()
                problem = self.problem_with(module, path, mutant)
                if time.monotonic() - begun > 2.0:
                    problem = "took more than 2 s"
                if problem:
                    count, example = problems.get(problem, (0, mutant.hex()))  # the first one
                    problems[problem] = (count + 1, example)
                accepted += problem is None and self.last_accepted
                tried += 1
        finally:
            os.close(fd)
        if problems:
            self.fail("\n".join(f"{count} of {tried} mutants: {problem}; the first: {example}"
                                 for problem, (count, example) in problems.items()))
        self.assertLess(time.monotonic() - started, 120.0)
        self.assertGreater(accepted, 0)  # the refitted flips of tensor bytes, at least
        self.assertGreater(tried, 10 * len(data))

    def problem_with(self, module, path, mutant):
        """None when the script read `mutant` back exactly or refused it in one printable line
        naming the file; else what went wrong."""
        self.last_accepted = False
        try:
            result = module.read_checkpoint(path, load_tensors=False)
        except module.CheckpointError as e:
            message = str(e)
            if not message.startswith(f"checkpoint {path}: "):
                return "a message that does not start 'checkpoint PATH: '"
            if not all(" " <= ch <= "~" for ch in message):
                return "a message with a character that is not printable ASCII"
            return None
        except Exception as e:  # noqa: BLE001  (any other exception is the bug looked for)
            return f"{type(e).__name__} (a traceback)"
        self.last_accepted = True
        return self.problem_with_accepted(module, result, mutant)

    def problem_with_accepted(self, module, result, mutant):
        # One encoding per checkpoint: what was accepted writes back to the very same bytes, so
        # nothing was skipped or guessed (fuzz/fuzz_checkpoint.cpp's rule).
        if serialise(result) != mutant:
            return "accepted, and writes back differently"
        try:
            json.dumps(module.json_figures({k: v for k, v in result.items() if k != "tensors"}),
                       allow_nan=False)
            if torch is not None:
                module.state_dict(result["tensors"])
        except Exception as e:  # noqa: BLE001
            return f"accepted, then {type(e).__name__} in --json or the state_dict"
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
