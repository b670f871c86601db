#!/usr/bin/env python3
"""torch.distributed over NCCL as the baseline of the nccl-cross phase of
bench/gpu_issue16.sh: N processes on GPU 0, each with its own NCCL_HOSTID
(NCCL then takes them for separate hosts and uses its socket transport
over loopback, as the kolo agents of that phase do), float32 Sum
all_reduce of 4 B..--max-bytes (x4 steps), warm-up then timed, each op
followed by torch.cuda.synchronize(). Rank 0 prints one line per size:

    BENCHROW bytes us_per_op algbw_GBps busbw_GBps

(busbw = algbw x 2(n-1)/n, nccl-tests' count), then BENCH OK.

    python3 bench/gpu/torch_nccl_hostid_bench.py --np 2 [--max-bytes 268435456]
"""

import argparse
import os
import socket
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, n, port, max_bytes, out):
    os.environ["NCCL_HOSTID"] = "torch-bench-%d" % rank
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=n, device_id=torch.device("cuda", 0))
    buf = torch.ones(max(max_bytes // 4, 1), dtype=torch.float32, device="cuda")
    rows = []
    size = 4
    while size <= max_bytes:
        t = buf[: size // 4]
        iters = 50 if size <= 1 << 20 else 10 if size <= 16 << 20 else 4
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
            torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / iters * 1e6
        algbw = size / us / 1e3
        rows.append("BENCHROW %d %.1f %.3f %.3f" % (size, us, algbw, algbw * 2 * (n - 1) / n))
        size *= 4
    dist.destroy_process_group()
    if rank == 0:
        out.put(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device: torch.cuda.is_available() is False")
        return 0
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, args.np, port, args.max_bytes, out))
             for r in range(args.np)]
    for p in procs:
        p.start()
    rows = out.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    print("\n".join(rows))
    if bad:
        print("torch bench: worker exit codes %s" % bad)
        return 1
    print("BENCH OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
