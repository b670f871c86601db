#!/usr/bin/env python3
"""PyTorch Lightning on kolo: a Trainer with DDPStrategy(process_group_backend="kolo").

    kolorun -np 2 python examples/lightning_kolo.py [--steps 6] [--check]

A small regression model on synthetic data, trained on CPU for --steps
batches of 4 samples per rank. --check also trains the same model in plain
torch in this process on the whole batches (what one process would do) and
fails unless the parameters agree within 1e-5; every rank prints a
checksum of its parameters (they must be identical).
"""
import argparse
import os
import warnings

import torch

import kolo.torch  # noqa: F401  (registers backend "kolo")
from kolo.lightning import KoloEnvironment, trainer_kwargs

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*GPU available but not used.*")
import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.strategies import DDPStrategy  # noqa: E402

PER_RANK = 4


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_model()

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data(n):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    kw = trainer_kwargs()
    size = kw["devices"] * kw["num_nodes"]
    x, y = data(a.steps * PER_RANK * size)
    # Our own sampler without shuffling (Lightning's own one shuffles here):
    # rank r gets the samples r, r + size, ..., so a step's samples over all
    # ranks are one contiguous block of the data.
    rank = int(os.environ["KOLO_RANK"])
    dataset = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=size, rank=rank, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=PER_RANK, sampler=sampler)
    module = Regression()
    trainer = pl.Trainer(accelerator="cpu", **kw,
                         strategy=DDPStrategy(process_group_backend="kolo",
                                              cluster_environment=KoloEnvironment()),
                         use_distributed_sampler=False, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader)
    pg = torch.distributed.distributed_c10d._get_default_group()
    assert pg.getBackendName() == "kolo", pg.getBackendName()
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    print("lightning rank %d steps %d checksum %s" % (rank, trainer.global_step,
                                                      flat.double().sum().item().hex()))
    if a.check:
        ref = make_model()
        opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        block = PER_RANK * size
        for s in range(a.steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(ref(x[s * block:(s + 1) * block]),
                                         y[s * block:(s + 1) * block]).backward()
            opt.step()
        diff = (flat - torch.cat([p.detach().reshape(-1) for p in ref.parameters()])).abs().max()
        assert trainer.global_step == a.steps, trainer.global_step
        assert diff.item() <= 1e-5, "parameters differ from one process by %g" % diff.item()
        print("lightning rank %d matches one process: max |diff| %.3g" % (rank, diff.item()))


if __name__ == "__main__":
    main()
