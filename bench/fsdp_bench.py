"""FSDP2 (fully_shard) step time on backend "kolo" against "gloo": same
script, same processes.

    kolorun -np 2 "$KOLO_PYTHON" bench/fsdp_bench.py [--layers 4] [--dim 512]
        [--seq 128] [--batch 8] [--steps 10] [--warmup 3] [--rounds 3]

A stack of transformer blocks (nn.TransformerEncoderLayer, d_model --dim,
4 heads, feed-forward 4x) sharded with fully_shard per block and at the
root, on a 1-D DeviceMesh over the default group (backend kolo, kolorun's
job) and over a second group of the same ranks (backend gloo), alternating
which goes first each round. Each step: forward, backward (FSDP2's
all-gathers and reduce-scatters through the group), SGD. Rank 0 prints the
per-step time (the slowest rank's) per round and the medians. Set
PYTHONPATH=client_lib/python and KOLO_LIBRARY=build/lib/libkolo.so.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import kolo.torch.distributed  # noqa: F401  (backend "kolo", init_method kolo://)


def model(args):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.TransformerEncoderLayer(args.dim, 4, 4 * args.dim, dropout=0.0,
                                                      batch_first=True)
                           for _ in range(args.layers)])


def bench(group, args):
    m = model(args)
    mesh = DeviceMesh.from_group(group, "cpu")
    for block in m:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(args.batch, args.seq, args.dim)

    def step():
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    mine = torch.tensor([(time.perf_counter() - t0) / args.steps])
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return mine.item() * 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(backend="kolo", init_method="kolo://")
    groups = {"kolo": dist.group.WORLD,
              "gloo": dist.new_group(list(range(dist.get_world_size())), backend="gloo")}
    res = {k: [] for k in groups}
    for r in range(args.rounds):
        order = list(groups) if r % 2 == 0 else list(reversed(list(groups)))
        for name in order:
            res[name].append(bench(groups[name], args))
        if dist.get_rank() == 0:
            print("round %d: %s" % (r, "  ".join("%s %.1f ms/step" % (k, res[k][-1])
                                                 for k in groups)), flush=True)
    if dist.get_rank() == 0:
        med = {k: statistics.median(v) for k, v in res.items()}
        params = sum(q.numel() for q in model(args).parameters())
        load = open("/proc/loadavg").read().split()[:3]
        print("RESULT fsdp2 np=%d layers=%d dim=%d (%.1fM params) seq=%d batch/rank=%d: kolo "
              "%.1f ms/step, gloo %.1f ms/step, gloo/kolo %.2f (medians of %d rounds; loadavg %s)"
              % (dist.get_world_size(), args.layers, args.dim, params / 1e6, args.seq,
                 args.batch, med["kolo"], med["gloo"], med["gloo"] / med["kolo"], args.rounds,
                 " ".join(load)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
