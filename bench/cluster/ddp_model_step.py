#!/usr/bin/env python3
"""ddp_model_step.py: the model step of kolo-bench --model-step, done the way PyTorch DDP does it on Gloo.

One process per rank (cluster.py --model-peers ddp starts one in each node). Each step replays a model's
gradients (bench/models/NAME.txt) in reverse registration order with the same compute as kolo-bench: the
step's --compute-ms split over the gradients by --compute-profile (NAME.flops) or by parameter count,
slept until t0 + the compute of every gradient so far. The gradients live in DDP's buckets, assigned by
torch's own torch.distributed._compute_bucket_assignment_by_size with DDP's limits (the first bucket
1 MiB, the rest 25 MiB, in the order the gradients become ready); a bucket's allreduce is posted async on
the gloo process group as soon as its last gradient is ready, buckets in order (DDP's reducer), and the
step waits for every bucket. As DDP with gradient_as_bucket_view=True: the gradients are views into the
buckets, so no copy in or out (DDP's default copies each gradient into its bucket: this is the cheaper
case). What is not emulated: autograd itself (compute is a sleep, as for kolo), the optimizer, and
DDP's unused-parameter search (off by default).

Efficiency = compute-only step / step with communication (each the median over steps of the slowest rank),
printed in the words kolo-bench uses so that cluster.py parses both alike. Every bucket is checked after
every step (each rank fills it with rank + 1; the sum is K (K + 1) / 2).

    GLOO_SOCKET_IFNAME=kc0 ddp_model_step.py --model bench/models/resnet50.txt --compute-profile \
        bench/models/resnet50.flops --compute-ms 2400 --rank R --size K --init tcp://10.231.0.1:29511
"""
import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist


def load(path):
    out = []
    for line in open(path):
        line = line.split("#", 1)[0].split()
        if line:
            out.append((line[0], int(line[1])))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--compute-profile")
    ap.add_argument("--compute-ms", type=float, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--init", required=True, help="torch init_method, e.g. tcp://10.231.0.1:29511")
    ap.add_argument("-w", "--warmup", type=int, default=1)
    ap.add_argument("-n", "--iters", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (default 25)")
    ap.add_argument("--first-bucket-mb", type=float, default=1.0, help="DDP's first bucket (default 1)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.size,
                            timeout=datetime.timedelta(seconds=300))
    tensors = load(a.model)
    weights = {n: float(c) for n, c in tensors}
    if a.compute_profile:
        weights = {n: 0.0 for n, _ in tensors}
        weights.update({n: float(c) for n, c in load(a.compute_profile)})
    total = sum(weights.values())
    order = list(reversed(range(len(tensors))))  # the backward pass: the last registered gradient first
    compute_s = [a.compute_ms / 1e3 * weights[tensors[i][0]] / total for i in order]

    meta = [torch.empty(tensors[i][1], device="meta") for i in order]
    limits = [int(a.first_bucket_mb * (1 << 20)), int(a.bucket_mb * (1 << 20))]
    groups, _ = dist._compute_bucket_assignment_by_size(meta, limits, [False] * len(meta))
    groups = sorted(groups, key=min)  # posted in the order their gradients become ready
    bucket_of = [0] * len(order)
    for b, g in enumerate(groups):
        for pos in g:
            bucket_of[pos] = b
    buffers = [torch.empty(sum(tensors[order[pos]][1] for pos in g)) for g in groups]
    nbytes = sum(b.numel() for b in buffers) * 4

    def backward(comm):
        pending = [len(g) for g in groups]
        works, nxt = [], 0
        t0 = time.perf_counter()
        done = 0.0
        for pos in range(len(order)):
            done += compute_s[pos]
            rest = t0 + done - time.perf_counter()
            if rest > 0:
                time.sleep(rest)
            if not comm:
                continue
            pending[bucket_of[pos]] -= 1
            while nxt < len(groups) and pending[nxt] == 0:  # DDP's reducer posts buckets in order
                works.append(dist.all_reduce(buffers[nxt], async_op=True))
                nxt += 1
        for w in works:
            w.wait()
        return time.perf_counter() - t0

    expect = a.size * (a.size + 1) / 2
    times, wrong = [], 0
    for it in range(a.warmup + a.iters):
        for b in buffers:
            b.fill_(a.rank + 1)
        dist.barrier()
        t = backward(True)
        wrong += sum(int((b != expect).sum()) for b in buffers)
        if it >= a.warmup:
            times.append(t)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    bad = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(bad)
    compute_only = statistics.median(backward(False) for _ in range(5))
    step = statistics.median(slowest.tolist())
    if a.rank == 0:
        print("# ddp-gloo model step %s: %d tensors, %d bytes in %d buckets (first %g MiB, then %g MiB), K=%d"
              % (os.path.basename(a.model), len(tensors), nbytes, len(groups), a.first_bucket_mb, a.bucket_mb,
                 a.size))
        print("# steps (slowest rank, s): %s; wrong elements %d" % (" ".join("%.3f" % t for t in slowest.tolist()),
                                                                    int(bad.item())))
        print("# compute-only step %.1f us, step with communication %.1f us: scaling efficiency %.3f"
              % (compute_only * 1e6, step * 1e6, compute_only / step))
    dist.destroy_process_group()
    return 1 if int(bad.item()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
