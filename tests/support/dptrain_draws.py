"""dptrain's random draws in Python, written from their definitions (lib/src/core/random.cpp,
lib/src/data/batching.cpp, lib/src/data/augment.cpp, init_reference_weights in
lib/src/model/model.cpp): SplitMix64, its seed derivation, the Box-Muller normals of the initial
weights, the Fisher-Yates order of each epoch and the crop-and-flip draws of each step. With
them a PyTorch run starts from dptrain's weights and sees dptrain's batches, so that the two
trainings can be compared step for step (tests/integration/test_recipe_against_pytorch.py).
Not dptrain's code: a second implementation, which the comparison checks.
"""
import math

import torch
from torch import nn

MASK = (1 << 64) - 1
AUGMENT_STREAM = 0x61756700  # "aug" (lib/src/data/augment.cpp)


class Rng:
    """SplitMix64 (Steele, Lea and Flood 2014), as dptrain::Rng."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next_u64(self):
        self.state = (self.state + 0x9e3779b97f4a7c15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK
        return z ^ (z >> 31)

    def next_unit(self):  # [0, 1), 53 bits
        return (self.next_u64() >> 11) * 2.0 ** -53

    def next_below(self, bound):  # uniform in [0, bound), by rejection
        threshold = ((1 << 64) - bound) % bound
        while True:
            draw = self.next_u64()
            if draw >= threshold:
                return draw % bound


def derive_seed(seed, stream):
    mixer = Rng(seed ^ ((stream * 0xd1b54a32d192ed03) & MASK))
    mixer.next_u64()
    return mixer.next_u64()


def epoch_order(count, seed, epoch):
    """The order of the training images in 0-based `epoch`, a tensor of `count` indices."""
    rng = Rng(derive_seed(seed, epoch))
    order = list(range(count))
    for i in range(count - 1, 0, -1):
        j = rng.next_below(i + 1)
        order[i], order[j] = order[j], order[i]
    return torch.tensor(order, dtype=torch.int64)


def crop_flip_draws(seed, epoch, step, count, padding):
    """(dy, dx, flip) of the `count` images of the global batch at 0-based `epoch` and `step`."""
    rng = Rng(derive_seed(derive_seed(derive_seed(seed, AUGMENT_STREAM), epoch), step))
    dy, dx, flip = [], [], []
    for _ in range(count):
        dy.append(rng.next_below(2 * padding + 1))
        dx.append(rng.next_below(2 * padding + 1))
        flip.append(rng.next_u64() >> 63)
    return (torch.tensor(dy), torch.tensor(dx), torch.tensor(flip, dtype=torch.bool))


def normals(rng, count, std=0.01):
    """`count` float32 values of N(0, std^2) by Box-Muller, in pairs (cos, sin)."""
    values = []
    for i in range(0, count, 2):
        radius = math.sqrt(-2.0 * math.log(1.0 - rng.next_unit()))
        angle = 6.283185307179586476925286766559 * rng.next_unit()
        values.append(std * radius * math.cos(angle))
        if i + 1 < count:
            values.append(std * radius * math.sin(angle))
    return torch.tensor(values, dtype=torch.float32)


def init_weights(model, seed):
    """dptrain's initialisation of the book's model (tests/support/pytorch_resnet.py): every
    convolution's and linear layer's weight from one stream seeded by `seed`, in module order,
    biases zero; BatchNorm as constructed (gamma 1, beta 0)."""
    rng = Rng(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                module.weight.copy_(normals(rng, module.weight.numel()).view_as(module.weight))
                module.bias.zero_()
