#!/usr/bin/env python3
"""A Horovod PyTorch training script, as written for Horovod (CPU).

The only line that differs from the Horovod original is the import:
    import horovod.torch as hvd      ->      import kolo.torch as hvd

Run it with:
    kolorun -np 2 python3 examples/horovod_example_unchanged.py
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import kolo.torch as hvd

parser = argparse.ArgumentParser(description="Horovod-style PyTorch example (synthetic regression)")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size for training")
parser.add_argument("--epochs", type=int, default=3, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--log-interval", type=int, default=10,
                    help="how many batches to wait before logging training status")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="use adasum algorithm to do reduction")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                    help="apply gradient predivide factor in optimizer (default: 1.0)")


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.linspace(-1.0, 1.0, 16)
    y = (x @ w).unsqueeze(1) + 0.1 * torch.sin(3 * x[:, :1]) + 0.01 * torch.randn(n, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 1)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def main():
    args = parser.parse_args()

    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(args.seed)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    train_dataset = make_dataset(4096, seed=1)
    test_dataset = make_dataset(1024, seed=2)

    # Horovod: use DistributedSampler to partition the training data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=256, sampler=test_sampler)

    model = Model()

    # By default, Adasum doesn't need scaling up learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1

    # Horovod: scale learning rate by lr_scaler.
    optimizer = optim.Adam(model.parameters(), lr=args.lr * lr_scaler)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    # Horovod: agree on where to resume (rank 0 decides, e.g. from a checkpoint).
    resume_from_epoch = hvd.broadcast_object(0, root_rank=0, name="resume_from_epoch")

    for epoch in range(resume_from_epoch + 1, args.epochs + 1):
        model.train()
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.mse_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print("Train Epoch: {} [{}/{}]\tLoss: {:.6f}".format(
                    epoch, batch_idx * len(data), len(train_sampler), loss.item()))

        model.eval()
        test_loss = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                test_loss += F.mse_loss(model(data), target, reduction="sum").item()
        test_loss /= len(test_sampler)
        # Horovod: average metric values across workers.
        test_loss = metric_average(test_loss, "avg_loss")
        if hvd.rank() == 0:
            print("Test set: Average loss: {:.6f}".format(test_loss))

    # Every rank must hold the same weights.
    checksums = hvd.allgather_object(float(sum(p.double().sum() for p in model.parameters())))
    if hvd.rank() == 0:
        print("Parameter checksums per rank: {}".format(checksums))
        assert len(set(checksums)) == 1, "ranks diverged"
        print("Done: {} ranks, identical parameters".format(hvd.size()))


if __name__ == "__main__":
    main()
