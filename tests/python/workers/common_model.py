"""The small model, data and training configurations shared by the training
worker (run under kolorun) and the single-process reference (run by pytest).

Rank r of N trains on rows [r*ROWS, (r+1)*ROWS) of each step's combined batch
of N*ROWS rows, so averaging the ranks' gradients equals the gradient of the
combined batch: a distributed run must match `reference()` within float
tolerance.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

IN, HID, OUT = 12, 16, 3
ROWS = 4       # rows per rank per micro-batch
STEPS = 4
LR = 0.1
INIT_SEED = 1234

# name -> settings. dist: DistributedOptimizer keyword arguments.
CONFIGS = {
    "plain": dict(),
    "bucket": dict(dist=dict(gradient_as_bucket_view=True)),
    "groups": dict(dist=dict(groups=2, gradient_predivide_factor=2.0)),
    "grouplist": dict(dist=dict(groups="by-layer")),
    "bpps2": dict(micro=2, dist=dict(backward_passes_per_step=2)),
    "fp16": dict(dist=dict(compression="fp16"), tol=2e-2),
    "adam": dict(opt="adam"),
    "sum": dict(op="Sum"),
}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 2, 3, padding=1)
        self.fc1 = nn.Linear(2 * IN, HID)
        self.fc2 = nn.Linear(HID, OUT)

    def forward(self, x):
        x = F.relu(self.conv(x.unsqueeze(1))).flatten(1)
        return self.fc2(torch.tanh(self.fc1(x)))


def make_model(seed):
    torch.manual_seed(seed)
    return Net()


def make_optimizer(cfg, params, size):
    lr = LR / size if cfg.get("op") == "Sum" else LR  # Sum: scale lr back to the mean
    if cfg.get("opt") == "adam":
        return torch.optim.Adam(params, lr=0.01)
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def combined_batch(step, micro, size):
    g = torch.Generator().manual_seed(1000 + 31 * step + micro)
    x = torch.randn(size * ROWS, IN, generator=g)
    y = torch.randint(0, OUT, (size * ROWS,), generator=g)
    return x, y


def local_batch(step, micro, size, rank):
    x, y = combined_batch(step, micro, size)
    return x[rank * ROWS:(rank + 1) * ROWS], y[rank * ROWS:(rank + 1) * ROWS]


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def reference(cfg, size):
    """Single-process training on the combined batches."""
    model = make_model(INIT_SEED)
    opt = make_optimizer(dict(cfg, op=None), model.parameters(), 1)
    # broadcast_optimizer_state initializes a fresh optimizer as Horovod
    # does: zero gradients and one step (Adam counts it; SGD is unchanged).
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for step in range(STEPS):
        opt.zero_grad()
        for m in range(cfg.get("micro", 1)):
            x, y = combined_batch(step, m, size)
            F.cross_entropy(model(x), y).backward()
        opt.step()
    return flat_params(model)
