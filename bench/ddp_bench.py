"""DDP on backend "kolo" vs backend "gloo": same script, same processes.

    kolorun -np 2 "$KOLO_PYTHON" bench/ddp_bench.py [--model resnet18|convnet]
        [--batch 16] [--image 64] [--steps 10] [--warmup 3] [--rounds 3]

The default group is kolo (init_method="kolo://": kolorun's job, a TCPStore
for torch's own bookkeeping); a second group over the same ranks uses gloo.
Each round trains the same synthetic model (random images and labels, SGD)
once with DDP on each group, alternating which goes first; rank 0 prints
img/s (all ranks together) per round and the median per backend. Set
PYTHONPATH=client_lib/python and KOLO_LIBRARY=build/lib/libkolo.so.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import kolo.torch.distributed  # noqa: F401  (backend "kolo", init_method kolo://)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import synthetic_models  # noqa: E402


def resnet18(classes=1000):
    """torchvision's ResNet-18 layout (stem, 2 basic blocks per stage at 64,
    128, 256, 512 channels): the examples' ConvNet at width 64, defined
    there once (torchvision is not installed here)."""
    return synthetic_models.ConvNet(classes, width=64)


def convnet(classes=10):
    return nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.LazyLinear(256), nn.ReLU(), nn.Linear(256, classes))


def bench(group, args, classes):
    torch.manual_seed(0)
    model = resnet18(classes) if args.model == "resnet18" else convnet(classes)
    x = torch.randn(args.batch, 3, args.image, args.image)
    y = torch.randint(0, classes, (args.batch,))
    model(x)  # materializes lazy layers before DDP
    # group None: the compute-only ceiling (no DDP, no communication).
    ddp = model if group is None else nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    dt = time.perf_counter() - t0
    return args.steps * args.batch * dist.get_world_size() / dt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["resnet18", "convnet"], default="resnet18")
    p.add_argument("--batch", type=int, default=16, help="images per rank per step")
    p.add_argument("--image", type=int, default=64, help="image side (pixels)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ceiling", action="store_true",
                   help="also time the model alone on every rank (no DDP): the compute-only ceiling")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(backend="kolo", init_method="kolo://")
    groups = {"kolo": dist.group.WORLD,
              "gloo": dist.new_group(list(range(dist.get_world_size())), backend="gloo")}
    if args.ceiling:
        groups["compute-only"] = None
    classes = 1000 if args.model == "resnet18" else 10
    res = {k: [] for k in groups}
    for r in range(args.rounds):
        order = list(groups) if r % 2 == 0 else list(reversed(list(groups)))
        for name in order:
            res[name].append(bench(groups[name], args, classes))
        if dist.get_rank() == 0:
            print("round %d: %s" % (r, "  ".join("%s %.1f img/s" % (k, res[k][-1])
                                                 for k in groups)), flush=True)
    if dist.get_rank() == 0:
        load = open("/proc/loadavg").read().split()[:3]
        print("RESULT model=%s np=%d batch/rank=%d image=%d steps=%d: kolo %.1f img/s, "
              "gloo %.1f img/s (medians of %d rounds; loadavg %s)"
              % (args.model, dist.get_world_size(), args.batch, args.image, args.steps,
                 statistics.median(res["kolo"]), statistics.median(res["gloo"]), args.rounds,
                 " ".join(load)), flush=True)
        if args.ceiling:
            print("RESULT compute-only (no DDP) %.1f img/s: kolo at %.2f of it, gloo at %.2f"
                  % (statistics.median(res["compute-only"]),
                     statistics.median(res["kolo"]) / statistics.median(res["compute-only"]),
                     statistics.median(res["gloo"]) / statistics.median(res["compute-only"])), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
