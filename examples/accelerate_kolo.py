#!/usr/bin/env python3
"""Hugging Face Accelerate on kolo.

    kolorun -np 2 python examples/accelerate_kolo.py [--steps 6] [--check]

On CPU Accelerate 1.x always initializes torch.distributed with "gloo" (or
"mpi"), whatever it is told; it uses a process group that already exists,
so the script creates kolo's first (two lines), then uses Accelerate as
usual: prepare(), accelerator.backward(), gather(). --check also trains the
same model in plain torch in this process on the whole batches and fails
unless the parameters agree within 1e-5; every rank prints a checksum of its
parameters (they must be identical).
"""
import argparse
import os

import torch
import torch.distributed as dist

import kolo.torch  # noqa: F401  (registers backend "kolo")

PER_RANK = 4


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    dist.init_process_group(backend="kolo")  # env:// from kolorun's variables
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    acc = Accelerator(cpu=True)
    size = acc.num_processes
    assert acc.distributed_type == DistributedType.MULTI_CPU, acc.distributed_type
    assert dist.get_backend() == "kolo" and size == dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    n = a.steps * PER_RANK * size
    x, y = torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g)
    # Accelerate gives process r the batches r, r + size, ...: a step's
    # batches over all ranks are one contiguous block of the data.
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=PER_RANK, shuffle=False)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = acc.prepare(model, opt, loader)
    steps = 0
    for xb, yb in loader:
        opt.zero_grad()
        acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
        opt.step()
        steps += 1
    params = list(acc.unwrap_model(model).parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    every = acc.gather(flat.reshape(1, -1))
    assert all(torch.equal(r, flat) for r in every), "ranks disagree"
    rank = acc.process_index
    print("accelerate rank %d steps %d checksum %s" % (rank, steps, flat.double().sum().item().hex()))
    if a.check:
        assert steps == a.steps, steps
        ref = make_model()
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        block = PER_RANK * size
        for s in range(a.steps):
            ropt.zero_grad()
            torch.nn.functional.mse_loss(ref(x[s * block:(s + 1) * block]),
                                         y[s * block:(s + 1) * block]).backward()
            ropt.step()
        diff = (flat - torch.cat([p.detach().reshape(-1) for p in ref.parameters()])).abs().max()
        assert diff.item() <= 1e-5, "parameters differ from one process by %g" % diff.item()
        print("accelerate rank %d matches one process: max |diff| %.3g" % (rank, diff.item()))
    acc.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    main()
