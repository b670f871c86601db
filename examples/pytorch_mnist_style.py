#!/usr/bin/env python3
"""A small MNIST-style training script, converted to data-parallel training
with kolo by the usual Horovod lines (marked "# kolo:").

The data is synthetic (noisy copies of ten fixed random 28x28 patterns), so
it needs no download and trains in seconds on a CPU:

    kolorun -np 2 python3 examples/pytorch_mnist_style.py
    kolorun -np 1 python3 examples/pytorch_mnist_style.py   # one rank
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import kolo.torch as hvd  # kolo: instead of `import horovod.torch as hvd`


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=5)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=5)
        self.fc1 = nn.Linear(256, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_mnist(n, seed):
    # Ten fixed random 28x28 "digit" templates; each image is its label's
    # template under heavy noise.
    templates = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = templates[labels] + 2.0 * torch.randn(n, 1, 28, 28, generator=g)
    return TensorDataset(images, labels)


def metric_average(value, name):
    # kolo: average a metric over all ranks
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    parser = argparse.ArgumentParser(description="MNIST-style example on synthetic data")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--zero-copy", action="store_true",
                        help="keep gradients in agent-shared memory (gradient_as_bucket_view)")
    args = parser.parse_args()

    hvd.init()  # kolo: join the job
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))

    train_set = synthetic_mnist(args.samples, seed=1)
    test_set = synthetic_mnist(args.samples // 4, seed=2)
    # kolo: each rank reads its own shard
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                      shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = Net()
    # kolo: scale the learning rate by the number of ranks
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    # kolo: same initial weights and optimizer state everywhere
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    # kolo: average gradients across ranks during backward
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         gradient_as_bucket_view=args.zero_copy)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()

        model.eval()
        test_loss, correct = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                correct += output.argmax(1).eq(target).sum().item()
        test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
        accuracy = metric_average(correct / len(test_sampler), "avg_accuracy")
        if hvd.rank() == 0:  # kolo: print once
            print("epoch %d: test loss %.4f, accuracy %.1f%% (%d ranks)"
                  % (epoch, test_loss, 100.0 * accuracy, hvd.size()), flush=True)


if __name__ == "__main__":
    main()
