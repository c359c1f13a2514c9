#!/usr/bin/python3
"""Reference outputs of the book's ResNet-18 in PyTorch, for tests/integration/test_pytorch_equivalence.cpp.

The C++ test loads the parameters written here into dptrain::ResNet, repeats one training-mode
forward/backward and one eval-mode forward, and checks that logits, loss, gradients and
BatchNorm running statistics agree with PyTorch's.

Regenerate (Debian's Python, which has torch; the `python3` on PATH may not):
    /usr/bin/python3 tests/support/make_pytorch_fixture.py
which rewrites tests/fixtures/resnet18_w8_pytorch.bin. The output depends only on the seed below
and the PyTorch version (1.13 was used), so regenerate only when the model or format changes.

File format, all little-endian:
    8 bytes magic b"DPTFIX01", uint32 entry count, then per entry:
    uint32 name length, name (UTF-8), uint32 ndim, ndim x int64 dims, float32 data (row-major).
"""

import os
import struct
import sys

import torch
from torch import nn
from torch.nn import functional as F

from pytorch_resnet import resnet18

SEED = 20240611
WIDTH = 8          # small, so the fixture stays small; the structure is the same at 64
BATCH = 8
NUM_CLASSES = 10
BOOK_PARAMETER_COUNT = 11_175_818  # resnet18(10, in_channels=1, width=64)
OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                      "resnet18_w8_pytorch.bin")


# ---- Writing --------------------------------------------------------------------------------

def write_fixture(path, entries):
    """entries: list of (name, tensor); every tensor is written as float32."""
    with open(path, "wb") as f:
        f.write(b"DPTFIX01")
        f.write(struct.pack("<I", len(entries)))
        for name, tensor in entries:
            encoded = name.encode("utf-8")
            data = tensor.detach().to(torch.float32).contiguous().cpu()
            f.write(struct.pack("<I", len(encoded)))
            f.write(encoded)
            f.write(struct.pack("<I", data.dim()))
            for d in data.shape:
                f.write(struct.pack("<q", d))
            # '<f' explicitly, so the file is little-endian whatever the host is.
            f.write(struct.pack("<%df" % data.numel(), *data.reshape(-1).tolist()))


def main():
    # One thread: the reference numbers should not depend on the machine's core count.
    torch.set_num_threads(1)
    torch.manual_seed(SEED)

    count = sum(p.numel() for p in resnet18(NUM_CLASSES, 1, width=64).parameters())
    assert count == BOOK_PARAMETER_COUNT, f"width-64 model has {count} parameters"

    net = resnet18(NUM_CLASSES, 1, width=WIDTH)
    # PyTorch's default init for convs and the linear layer; BatchNorm would start as the
    # identity affine map with mean 0 / var 1, which would hide a swapped weight/bias or
    # mean/var, so randomise all four.
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)

    entries = []
    x = torch.rand(BATCH, 1, 28, 28)
    labels = torch.randint(0, NUM_CLASSES, (BATCH,))
    entries.append(("input", x))
    entries.append(("labels", labels))

    state = net.state_dict()
    for name, p in net.named_parameters():
        entries.append((f"param/{name}", p))
    buffer_names = [n for n, _ in net.named_buffers()
                    if n.endswith("running_mean") or n.endswith("running_var")]
    for name in buffer_names:
        entries.append((f"buffer/{name}", state[name].clone()))

    net.train()
    logits = net(x)
    loss = F.cross_entropy(logits, labels)  # mean over the batch
    loss.backward()
    entries.append(("train_logits", logits))
    entries.append(("loss", loss))
    for name, p in net.named_parameters():
        assert p.grad is not None, name
        entries.append((f"grad/{name}", p.grad))
    state = net.state_dict()
    for name in buffer_names:
        entries.append((f"buffer_after/{name}", state[name]))

    net.eval()
    with torch.no_grad():
        entries.append(("eval_logits", net(x)))

    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    write_fixture(OUTPUT, entries)
    print(f"wrote {OUTPUT}: {len(entries)} entries, {os.path.getsize(OUTPUT)} bytes, "
          f"{sum(p.numel() for p in net.parameters())} parameters at width {WIDTH}, "
          f"loss {loss.item():.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
