"""The book's ResNet-18 in PyTorch (D2L, "Training on Multiple GPUs", concise version), with a
width parameter: the peer that dptrain's C++ model is checked against (make_pytorch_fixture.py)
and benchmarked against (bench/pytorch_peer.py). Layer names match dptrain's state dict.
"""

from torch import nn
from torch.nn import functional as F


class Residual(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus a shortcut (identity, or 1x1 conv when the shape changes)."""

    def __init__(self, in_channels, out_channels, use_1x1conv=False, strides=1, inplace=False):
        super().__init__()
        self.inplace = inplace
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1,
                               stride=strides)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
        if use_1x1conv:
            self.conv3 = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        if self.inplace:  # dptrain's choice: the same values, two activations fewer per block
            y = F.relu_(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            y += self.conv3(x) if self.conv3 is not None else x
            return F.relu_(y)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return F.relu(y + x)


def resnet_stage(in_channels, out_channels, num_blocks, first_stage=False, inplace=False):
    # Every stage but the first halves H and W in its first block and projects the shortcut.
    blocks = []
    for i in range(num_blocks):
        if i == 0 and not first_stage:
            blocks.append(Residual(in_channels, out_channels, use_1x1conv=True, strides=2,
                                   inplace=inplace))
        else:
            blocks.append(Residual(out_channels, out_channels, inplace=inplace))
    return nn.Sequential(*blocks)


def resnet18(num_classes, in_channels=1, width=64, inplace=False):
    """inplace=True runs the ReLUs and the shortcut's sum in place, as dptrain's model does."""
    w = width
    # The stem has no max-pool (28x28 inputs); its layers are named "0", "1", "2".
    net = nn.Sequential(nn.Conv2d(in_channels, w, kernel_size=3, stride=1, padding=1),
                        nn.BatchNorm2d(w), nn.ReLU(inplace=inplace))
    net.add_module("resnet_block1", resnet_stage(w, w, 2, first_stage=True, inplace=inplace))
    net.add_module("resnet_block2", resnet_stage(w, 2 * w, 2, inplace=inplace))
    net.add_module("resnet_block3", resnet_stage(2 * w, 4 * w, 2, inplace=inplace))
    net.add_module("resnet_block4", resnet_stage(4 * w, 8 * w, 2, inplace=inplace))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(8 * w, num_classes)))
    return net


