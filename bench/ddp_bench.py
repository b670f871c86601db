"""DDP on backend "kolo" vs backend "gloo": same script, same processes.

    kolorun -np 2 "$KOLO_PYTHON" bench/ddp_bench.py [--model resnet18|resnet50|convnet]
        [--batch 16] [--image 64] [--steps 10] [--warmup 3] [--rounds 3]
        [--bucket-view 0|1] [--ceiling] [--ddp-ceiling]

The default group is kolo (init_method="kolo://": kolorun's job, a TCPStore
for torch's own bookkeeping); a second group over the same ranks uses gloo.
Each round trains the same synthetic model (random images and labels, SGD)
once with DDP on each group, alternating which goes first; rank 0 prints
img/s (all ranks together) per round and the median per backend.
--ceiling adds the model alone (no DDP); --ddp-ceiling adds DDP with a comm
hook that sends nothing: what any backend could reach under DDP. Set
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
    there once (the examples run without torchvision)."""
    return synthetic_models.ConvNet(classes, width=64)


def resnet50(classes=1000):
    import torchvision  # pinned in scripts/python-requirements.txt
    return torchvision.models.resnet50(num_classes=classes)


def convnet(classes=10):
    return nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.LazyLinear(256), nn.ReLU(), nn.Linear(256, classes))


def _noop_hook(_state, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def bench(group, args, classes):
    torch.manual_seed(0)
    model = {"resnet18": resnet18, "resnet50": resnet50, "convnet": convnet}[args.model](classes)
    x = torch.randn(args.batch, 3, args.image, args.image)
    y = torch.randint(0, classes, (args.batch,))
    model(x)  # materializes lazy layers before DDP
    # group None: the compute-only ceiling (no DDP, no communication);
    # "noop": DDP over the default group with a comm hook that communicates
    # nothing (DDP's own cost: hooks, bucket copies, buffer broadcasts).
    if group is None:
        ddp = model
    else:
        pg = dist.group.WORLD if group == "noop" else group
        ddp = nn.parallel.DistributedDataParallel(model, process_group=pg,
                                                  gradient_as_bucket_view=args.bucket_view)
        if group == "noop":
            ddp.register_comm_hook(None, _noop_hook)
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
    p.add_argument("--model", choices=["resnet18", "resnet50", "convnet"], default="resnet18")
    p.add_argument("--batch", type=int, default=16, help="images per rank per step")
    p.add_argument("--image", type=int, default=64, help="image side (pixels)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ceiling", action="store_true",
                   help="also time the model alone on every rank (no DDP): the compute-only ceiling")
    p.add_argument("--ddp-ceiling", action="store_true",
                   help="also time DDP with a comm hook that communicates nothing: the ceiling "
                        "of any backend under DDP")
    p.add_argument("--bucket-view", type=int, choices=[0, 1], default=1,
                   help="DDP gradient_as_bucket_view for every backend (1: torch's faster "
                        "setting, no gradient copies in and out of the buckets)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(backend="kolo", init_method="kolo://")
    groups = {"kolo": dist.group.WORLD,
              "gloo": dist.new_group(list(range(dist.get_world_size())), backend="gloo")}
    if args.ceiling:
        groups["compute-only"] = None
    if args.ddp_ceiling:
        groups["ddp-no-comm"] = "noop"
    classes = 10 if args.model == "convnet" else 1000
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
        med = {k: statistics.median(v) for k, v in res.items()}
        print("RESULT model=%s np=%d batch/rank=%d image=%d steps=%d bucket_view=%d: kolo %.1f "
              "img/s, gloo %.1f img/s, kolo/gloo %.2f (medians of %d rounds; loadavg %s)"
              % (args.model, dist.get_world_size(), args.batch, args.image, args.steps,
                 args.bucket_view, med["kolo"], med["gloo"], med["kolo"] / med["gloo"],
                 args.rounds, " ".join(load)), flush=True)
        if args.ddp_ceiling:
            print("RESULT DDP without communication %.1f img/s: kolo at %.2f of it, gloo at %.2f; "
                  "a free backend would be %.2fx gloo"
                  % (med["ddp-no-comm"], med["kolo"] / med["ddp-no-comm"],
                     med["gloo"] / med["ddp-no-comm"], med["ddp-no-comm"] / med["gloo"]),
                  flush=True)
        if args.ceiling:
            print("RESULT compute-only (no DDP) %.1f img/s: kolo at %.2f of it, gloo at %.2f"
                  % (statistics.median(res["compute-only"]),
                     statistics.median(res["kolo"]) / statistics.median(res["compute-only"]),
                     statistics.median(res["gloo"]) / statistics.median(res["compute-only"])), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
