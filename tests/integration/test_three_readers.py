#!/usr/bin/env python3
"""One definition of a valid file, held by its three readers: every crafted file below goes
through dptrain (`dptrain eval --model F`), PyPI safetensors (load_file and safe_open's metadata)
and scripts/read_checkpoint.py, and each reader's verdict must be the one docs/checkpoints.md ("A
valid file") gives at that reader's level. Prints the table (file, dptrain, safetensors,
read_checkpoint.py, agree?) and exits 1 when a row disagrees. Not here: each reader's own words
for each fault (tests/core/test_safetensors.cpp, tests/train/test_checkpoint.cpp,
test_read_checkpoint.py).

    .venv-tests/bin/python3 tests/integration/test_three_readers.py --dptrain build/app/dptrain

The levels (the "expected" of each row):
  valid      every reader reads it (read_checkpoint.py: a file of dptrain's own).
  container  not a safetensors file: every reader refuses it.
  dptrain    a safetensors file, but not a valid file of dptrain's (a tensor missing, extra, of
             another dtype or shape; a digest or a run state that does not hold): PyPI
             safetensors, which knows neither the model nor the run state, reads its container
             ("container ok"); dptrain and the script refuse it.
  stricter   a file PyPI safetensors 0.6.2 reads although it is ambiguous or outside the format's
             specification (a name twice, of which it keeps the last; a field it ignores; a header
             not starting with '{'); dptrain and the script refuse it, and say why.
  plain      a state dict of PyTorch's without dptrain's run state: dptrain's eval reads it
             (Note [A state dict from PyTorch is read as PyTorch reads it] in checkpoint.cpp),
             PyPI safetensors reads it, and read_checkpoint.py, which reads dptrain's own files
             only, says it is none ("not dptrain's").
  plain-bad  such a state dict that is not the model's: PyPI reads the container, dptrain refuses,
             the script says it is not dptrain's.
The files are written by tests/support/dptrain_safetensors.py (dptrain's format, from the
specification) and by PyTorch with PyPI safetensors' save_file (the state dicts); the data is a
Fashion-MNIST of four images written here, so that no download is needed.
"""
import argparse
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import dptrain_safetensors as st  # noqa: E402

import torch  # noqa: E402  (the venv has Debian's python3-torch and PyPI safetensors)
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from pytorch_resnet import resnet18  # noqa: E402

SCRIPT = os.environ.get("READ_CHECKPOINT_SCRIPT") or os.path.join(HERE, "..", "..", "scripts",
                                                                  "read_checkpoint.py")
TIMEOUT_S = 60  # per run of a reader: far above its real time


# ---- The files ---------------------------------------------------------------------------------

def header_and_data(data):
    n = struct.unpack_from("<Q", data)[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def raw_header(text, data):
    """A file of the header bytes `text` as they are (no JSON of ours), then `data`."""
    return struct.pack("<Q", len(text)) + text + data


def respelled(data, edit):
    """`data` with its header's JSON text replaced by edit(text); the content, and so the
    digest, unchanged unless the edit changes it."""
    n = struct.unpack_from("<Q", data)[0]
    return raw_header(edit(data[8:8 + n].rstrip(b" ")), data[8 + n:])


def dptrain_file(tensors=None, edit_metadata=None, kind="model", edit_state=None):
    state = st.valid_state()
    if edit_state:
        edit_state(state)
    return st.checkpoint(state, st.model_tensors() if tensors is None else tensors, kind=kind,
                         edit=edit_metadata)


def with_tensor(name, dtype, shape, raw):
    return [(name, dtype, shape, raw) if n == name else (n, d, s, r)
            for n, d, s, r in st.model_tensors()]


def refit(data, header_edit):
    """`data` with header_edit(header) applied to its parsed header and the digest refitted to
    what PyPI safetensors then reads (the last of a name given twice), so that only the edit is
    at fault; the header is written by header_edit's own text when it returns bytes."""
    header, body = header_and_data(data)
    metadata = header["__metadata__"]
    tensors = [(name, e["dtype"], e["shape"], body[e["data_offsets"][0]:e["data_offsets"][1]])
               for name, e in header.items() if name != "__metadata__"]
    metadata["dptrain.digest"] = st.digest(metadata, tensors)
    text = header_edit(header)
    return raw_header(text, body)


def dumped(header):
    return json.dumps(header, separators=(",", ":")).encode()


def run_state_respelled(edit_text):
    """A valid model file whose run state's JSON text is edit_text(text), digest refitted."""
    return dptrain_file(edit_metadata=lambda m: m.__setitem__(
        "dptrain.run_state", edit_text(m["dptrain.run_state"])))


def torch_state_dict(dtype=torch.float32, keep=lambda name: True, edit=None):
    torch.manual_seed(0)
    sd = resnet18(10, 1, 4).state_dict()
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
          for k, v in sd.items() if keep(k)}
    if edit:
        edit(sd)
    return sd


def saved(sd, metadata=None):
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        save_file(sd, f.name, metadata=metadata)
        return open(f.name, "rb").read()


def rows():
    """(label, bytes, expected level, why) for every crafted file."""
    good = dptrain_file()
    header, body = header_and_data(good)
    entry = dict(header["0.bias"])
    name_twice = dumped(header)[:-1] + b',"0.bias":' + dumped(entry) + b"}"
    field_twice = dumped(header).replace(b'"0.bias":{"dtype":"F32"',
                                         b'"0.bias":{"dtype":"F32","dtype":"F32"', 1)
    nan4 = struct.pack("<4f", 0.0, float("nan"), 0.0, 0.0)
    return [
        ("a model file of dptrain's", good, "valid", ""),
        ("a checkpoint of dptrain's", dptrain_file(kind="checkpoint"), "valid", ""),
        ("a model file rewritten by PyPI save_file",
         saved(load_file_bytes(good), header["__metadata__"]), "valid", ""),
        ("padded with JSON whitespace (\\t\\r\\n)", respelled(good, lambda t: t + b"\t\r\n  "),
         "valid", ""),
        # Note [One JSON text, one reading]: what dptrain read and the others refused.
        ("bytes after a NUL in the header", respelled(good, lambda t: t + b'\0{"x":1}'),
         "container", ""),
        ("a NUL as header padding", respelled(good, lambda t: t + b"\0\0\0"), "container", ""),
        ("a byte after the header's object", respelled(good, lambda t: t + b"x"), "container", ""),
        ("a field twice in a tensor entry", raw_header(field_twice, body), "container", ""),
        ("the header not JSON", raw_header(b"{" + b"\xff" * 7, b""), "container", ""),
        ("the header longer than the file", good[:8 + len(dumped(header)) - 1], "container", ""),
        ("the data cut", good[:-4], "container", ""),
        ("the data padded", good + b"\0" * 4, "container", ""),
        ("a metadata value not a string",
         refit(good, lambda h: dumped(h).replace(b'"format":"pt"', b'"format":1')), "container",
         ""),
        ("a dtype no reader knows (Q8)",
         refit(good, lambda h: dumped(h).replace(b'"0.bias":{"dtype":"F32","shape":[4]',
                                                 b'"0.bias":{"dtype":"Q8","shape":[16]')),
         "container", ""),
        ("a hole between two tensors", refit(good, lambda h: dumped(h).replace(
            b'"data_offsets":[0,', b'"data_offsets":[4,')), "container", ""),
        ("a tensor name twice", raw_header(name_twice, body), "stricter",
         "PyPI keeps the last of two"),
        ("a metadata key twice", refit(good, lambda h: dumped(h).replace(
            b'"format":"pt"', b'"format":"other","format":"pt"')), "stricter",
         "PyPI keeps the last of two"),
        ("an unknown field in a tensor entry", refit(good, lambda h: dumped(h).replace(
            b'"0.bias":{"dtype":"F32"', b'"0.bias":{"x":1,"dtype":"F32"')), "stricter",
         "PyPI ignores it"),
        ("the header starting with a space", respelled(good, lambda t: b" " + t), "stricter",
         "the specification: it starts with '{'"),
        ("a run state key twice", run_state_respelled(
            lambda t: t.replace('"width":4', '"width":8,"width":4')), "dptrain", ""),
        ("bytes after a NUL in the run state", run_state_respelled(lambda t: t + '\0{"x":1}'),
         "dptrain", ""),
        ("a tensor missing", dptrain_file(
            [t for t in st.model_tensors() if t[0] != "1.running_mean"]), "dptrain", ""),
        ("num_batches_tracked missing (dptrain's own file)", dptrain_file(
            [t for t in st.model_tensors() if not t[0].endswith("num_batches_tracked")]),
         "dptrain", ""),
        ("a tensor extra", dptrain_file(st.model_tensors() + [("x", "F32", [1], b"\0" * 4)]),
         "dptrain", ""),
        ("a tensor of another shape", dptrain_file(
            with_tensor("fc.1.bias", "F32", [11], b"\0" * 44)), "dptrain", ""),
        ("an F16 tensor in dptrain's own file", dptrain_file(
            with_tensor("0.bias", "F16", [4], b"\0" * 8)), "dptrain", ""),
        ("an I32 tensor", dptrain_file(with_tensor("0.bias", "I32", [4], b"\0" * 16)), "dptrain",
         ""),
        ("a data bit flipped (digest)", good[:-1] + bytes([good[-1] ^ 1]), "dptrain", ""),
        ("a step past its epoch", dptrain_file(
            edit_state=lambda s: s.update(step_in_epoch=8)), "dptrain", ""),
        ("a NaN weight", dptrain_file(with_tensor("0.bias", "F32", [4], nan4)), "dptrain", ""),
        ("format version 4", dptrain_file(
            edit_metadata=lambda m: m.__setitem__("dptrain.format_version", "4")), "dptrain", ""),
        ("an empty header {}", raw_header(b"{}", b""), "plain-bad", ""),
        ("a PyTorch state dict, F32", saved(torch_state_dict()), "plain", ""),
        ("a PyTorch state dict, F16", saved(torch_state_dict(torch.float16)), "plain", ""),
        ("a PyTorch state dict, BF16", saved(torch_state_dict(torch.bfloat16)), "plain", ""),
        ("a PyTorch state dict, F64", saved(torch_state_dict(torch.float64)), "plain", ""),
        ("a state dict without num_batches_tracked", saved(torch_state_dict(
            keep=lambda k: not k.endswith("num_batches_tracked"))), "plain", ""),
        ("a state dict without running_var", saved(torch_state_dict(
            keep=lambda k: not k.endswith("running_var"))), "plain-bad", ""),
        ("a state dict with an int64 bias", saved(torch_state_dict(
            edit=lambda sd: sd.update({"0.bias": sd["0.bias"].long()}))), "plain-bad", ""),
        ("a state dict, F64 past float32's range", saved(torch_state_dict(
            torch.float64, edit=lambda sd: sd["0.bias"].fill_(1e300))), "plain-bad", ""),
        ("a state dict of DataParallel ('module.')", saved(
            {"module." + k: v for k, v in torch_state_dict().items()}), "plain-bad", ""),
    ]


def load_file_bytes(data):
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        f.write(data)
        f.flush()
        return load_file(f.name)


# ---- The readers -------------------------------------------------------------------------------

def write_idx(directory, name, magic, dims, payload):
    with gzip.open(os.path.join(directory, name), "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)


def tiny_fashion_mnist(directory):
    """Four 28x28 images of each split, labels 0 to 3: enough for an eval to run."""
    for prefix in ("train", "t10k"):
        images = bytes((i * 7 + j) % 256 for i in range(4) for j in range(28 * 28))
        write_idx(directory, f"{prefix}-images-idx3-ubyte.gz", 2051, (4, 28, 28), images)
        write_idx(directory, f"{prefix}-labels-idx1-ubyte.gz", 2049, (4,), bytes(range(4)))


def first_line(text):
    return (text.strip().splitlines() or [""])[0]


def dptrain_verdict(binary, path, data_dir):
    done = subprocess.run([binary, "eval", "--model", path, "--data-dir", data_dir,
                           "--devices", "cpu", "--threads", "1", "--batch-size", "4"],
                          capture_output=True, text=True, timeout=TIMEOUT_S,
                          errors="backslashreplace")
    if done.returncode == 0 and done.stdout.startswith("test acc: "):
        return "valid", ""
    if done.returncode != 0 and done.stderr.startswith("error: ") and \
            len(done.stderr.strip().splitlines()) == 1:
        return "refused", first_line(done.stderr)
    return "broken", f"exit {done.returncode}: {first_line(done.stderr)}"


def pypi_verdict(path):
    try:
        load_file(path)
        with safe_open(path, "pt") as f:
            f.metadata()
        return "container ok", ""
    except Exception as e:  # noqa: BLE001  (its errors are SafetensorError and friends)
        return "refused", f"{type(e).__name__}: {first_line(str(e))}"


def script_verdict(path):
    done = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True,
                          timeout=TIMEOUT_S, errors="backslashreplace")
    line = first_line(done.stderr)
    if done.returncode == 0:
        return "valid", ""
    if done.returncode == 1 and line.startswith("error: ") and \
            len(done.stderr.strip().splitlines()) == 1:
        if "a safetensors file without dptrain's run state" in line:
            return "not dptrain's", line
        return "refused", line
    return "broken", f"exit {done.returncode}: {line}"


# What each reader must say at each level.
EXPECTED = {
    "valid": ("valid", "container ok", "valid"),
    "container": ("refused", "refused", "refused"),
    "dptrain": ("refused", "container ok", "refused"),
    "stricter": ("refused", "container ok", "refused"),
    "plain": ("valid", "container ok", "not dptrain's"),
    "plain-bad": ("refused", "container ok", "not dptrain's"),
}


def table(results):
    head = ("file", "expected", "dptrain", "safetensors 0.6.2", "read_checkpoint.py", "agree?")
    lines = [head] + results
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    out = []
    for i, line in enumerate(lines):
        out.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths)) + " |")
        if i == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dptrain", required=True, help="the dptrain binary")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print each reader's refusal")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="three_readers.") as work:
        data_dir = os.path.join(work, "data")
        os.mkdir(data_dir)
        tiny_fashion_mnist(data_dir)
        results, disagreements = [], []
        for label, data, level, why in rows():
            path = os.path.join(work, "f.safetensors")
            with open(path, "wb") as f:
                f.write(data)
            got = (dptrain_verdict(args.dptrain, path, data_dir), pypi_verdict(path),
                   script_verdict(path))
            verdicts = tuple(v for v, _ in got)
            agree = verdicts == EXPECTED[level]
            expected = level + (f" ({why})" if why else "")
            results.append((label, expected, *verdicts, "yes" if agree else "NO"))
            if not agree:
                disagreements.append(label)
            if not agree or args.verbose:
                for reader, (verdict, detail) in zip(("dptrain", "safetensors", "script"), got):
                    if detail:
                        print(f"  {label}: {reader}: {detail}")
    print(table(results))
    print(f"{len(results)} files, {len(results) - len(disagreements)} agree with the definition "
          "(docs/checkpoints.md, \"A valid file\")")
    if disagreements:
        print("error: three readers: " + "; ".join(disagreements) + ": a reader's verdict is not "
              "the definition's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
