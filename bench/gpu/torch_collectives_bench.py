#!/usr/bin/env python3
"""Per-op time and bus bandwidth of kolo.torch's collectives on CUDA
tensors, nccl-tests style, under kolorun:

    kolorun -np 4 python3 bench/gpu/torch_collectives_bench.py [--min-bytes 4] \
        [--max-bytes 268435456] [--ops allreduce,broadcast,allgather,reducescatter,alltoall]

Each rank times, per op and size (x16 steps from --min-bytes), ops submitted
and synchronized one after the other on the current stream, then
torch.cuda.synchronize(): us/op is end to end, as a training step sees it
(copies into the device arena and back, or the staging through pinned host
memory for the ops the agent does not run on device memory). Rank 0 prints
the slowest rank's time; algbw = bytes / time, busbw as nccl-tests count it
(allreduce x 2(n-1)/n; allgather, reducescatter and alltoall x (n-1)/n of the
gathered / reduced size; broadcast x 1). The first op of every size is
checked against the expected values ("wrong" counts mismatching ranks).
The route column says how the op went: device (libkolo's device path) or
staged. With --device cpu the same on CPU tensors (the host path).
"""

import argparse
import sys
import time

import torch

import kolo.torch as hvd
from kolo.torch import _cuda

ALL_OPS = ["allreduce", "broadcast", "allgather", "reducescatter", "alltoall"]


def sizes(lo, hi):
    """lo, lo*16, ... up to hi, and hi itself."""
    s = lo
    while s < hi:
        yield s
        s *= 16
    yield hi


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-bytes", type=int, default=4)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--ops", default=",".join(ALL_OPS))
    ap.add_argument("--time-per-size", type=float, default=0.15,
                    help="seconds of timed ops per op and size (at least --min-iters ops)")
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--max-iters", type=int, default=200)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in ops if o not in ALL_OPS]
    if bad:
        ap.error("unknown ops %s (known: %s)" % (bad, ALL_OPS))

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch.cuda.is_available() is False)")
        return 0
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count()) if cuda else \
        torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if r == 0:
        route_ar = _cuda.route([torch.empty(1, device=dev)], "allreduce") if cuda else "host"
        print("# kolo.torch collectives on %s tensors, %d ranks, float32; allreduce/broadcast "
              "route: %s" % (args.device, n, route_ar))
        print("%-14s %12s %6s %12s %10s %10s %6s %s" % ("op", "bytes", "iters", "us/op", "algbw",
                                                         "busbw", "wrong", "route"))
    seq = 0
    for op in ops:
        for nbytes in sizes(args.min_bytes, args.max_bytes):
            count = max(nbytes // 4, 1)
            if op in ("reducescatter", "alltoall"):
                count = max(count // n * n, n)  # whole rows per rank
            x = torch.full((count,), float(r + 1), device=dev)
            expect = {"allreduce": float(n * (n + 1) // 2), "broadcast": 1.0,
                      "reducescatter": float(n * (n + 1) // 2)}

            def run_once(check):
                nonlocal seq
                seq += 1
                name = "%s.%d" % (op, seq)
                if op == "allreduce":
                    out = hvd.allreduce(x, op=hvd.Sum, name=name)
                    ok = not check or bool((out == expect[op]).all())
                elif op == "broadcast":
                    out = hvd.broadcast(x, 0, name=name)
                    ok = not check or bool((out == 1.0).all())
                elif op == "allgather":
                    out = hvd.allgather(x, name=name)
                    want = torch.arange(1, n + 1, device=dev, dtype=torch.float32).repeat_interleave(count)
                    ok = not check or bool(torch.equal(out, want))
                elif op == "reducescatter":
                    out = hvd.reducescatter(x, op=hvd.Sum, name=name)
                    ok = not check or bool((out == expect[op]).all())
                else:
                    out = hvd.alltoall(x, name=name)
                    want = torch.arange(1, n + 1, device=dev, dtype=torch.float32).repeat_interleave(count // n)
                    ok = not check or bool(torch.equal(out, want))
                return ok

            ok = run_once(True)
            run_once(False)  # warm-up
            sync()
            # How many iterations fit in the time per size (agreed by all ranks).
            t0 = time.perf_counter()
            run_once(False)
            sync()
            one = time.perf_counter() - t0
            iters = int(min(max(args.time_per_size / max(one, 1e-6), args.min_iters),
                            args.max_iters))
            iters = int(hvd.allreduce(torch.tensor([iters], dtype=torch.int64), op=hvd.Min,
                                      name="iters.%d" % seq).item())
            hvd.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run_once(False)
            sync()
            us = (time.perf_counter() - t0) / iters * 1e6
            stats = hvd.allreduce(torch.tensor([us, 0.0 if ok else 1.0], dtype=torch.float64),
                                  op=hvd.Max, name="stats.%d" % seq)
            wrong = int(hvd.allreduce(torch.tensor([0 if ok else 1], dtype=torch.int64),
                                      op=hvd.Sum, name="wrong.%d" % seq).item())
            if r == 0:
                us_max = float(stats[0])
                b = count * 4
                total = b * n if op == "allgather" else b
                algbw = total / (us_max * 1e-6) / 1e9
                factor = {"allreduce": 2.0 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)
                route = "host" if not cuda else (
                    _cuda.route([x], op, device_capable=op in ("allreduce", "broadcast")))
                print("%-14s %12d %6d %12.1f %10.2f %10.2f %6d %s"
                      % (op, total, iters, us_max, algbw, algbw * factor, wrong, route),
                      flush=True)
    hvd.shutdown()
    if r == 0:
        print("COLLECTIVES-BENCH OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
