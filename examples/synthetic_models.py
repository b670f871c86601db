"""Models for the synthetic benchmarks: torchvision's by name, or with
--model convnet a small ResNet-style network defined here."""

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from torchvision import models as tv_models
except ImportError:  # torchvision is optional
    tv_models = None


class _Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.b1(self.c1(x)))
        out = self.b2(self.c2(out))
        return F.relu(out + (x if self.skip is None else self.skip(x)))


class ConvNet(nn.Module):
    """A small ResNet-style network (the fallback without torchvision)."""

    def __init__(self, num_classes=1000, width=32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
            layers += [_Block(cin, cout, 1 if i == 0 else 2), _Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_model(name, num_classes):
    """The model and its name. A torchvision model without torchvision is an
    error, never a silent swap for the small network: a figure must be of the
    model it names."""
    if name == "convnet":
        return ConvNet(num_classes), "convnet"
    if tv_models is None:
        raise SystemExit(f"--model {name} needs torchvision, which this interpreter lacks: "
                         "install it (scripts/install-python.sh pins it) or pass --model convnet")
    if not hasattr(tv_models, name):
        raise SystemExit(f"--model {name}: torchvision.models has no such model")
    return getattr(tv_models, name)(num_classes=num_classes), name
