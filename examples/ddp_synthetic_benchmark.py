#!/usr/bin/env python3
"""The same synthetic benchmark as pytorch_synthetic_benchmark.py, with
torch DistributedDataParallel over gloo instead of kolo, for comparison.

Launch it with torchrun, or with its own launcher on 127.0.0.1:

    torchrun --nproc_per_node 2 examples/ddp_synthetic_benchmark.py --model resnet18
    python3 examples/ddp_synthetic_benchmark.py --np 2 --model resnet18

Options and output match pytorch_synthetic_benchmark.py (the model, data,
optimizer and timing are the same code paths); the last line is
"RESULT framework=ddp ...". Like it, it trains on the GPU when CUDA is
available (rank r on GPU r % device_count; --no-cuda: CPU): DDP over gloo on
CUDA tensors, the multi-process peer one GPU allows.
"""

import argparse
import os
import socket
import sys
import timeit

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_models import make_model  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark (DDP over gloo)",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--np", type=int, default=0,
                        help="start this many ranks here (0: run as one rank of torchrun)")
    parser.add_argument("--model", type=str, default="resnet50")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--num-threads", type=int, default=0,
                        help="torch threads per rank (0: cores / ranks)")
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="fp16 compression hook on the DDP buckets")
    parser.add_argument("--timeout-s", type=int, default=300)
    parser.add_argument("--no-cuda", action="store_true", default=False,
                        help="disables CUDA training")
    return parser.parse_args()


def run(rank, size, args):
    import datetime
    dist.init_process_group("gloo", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    threads = args.num_threads or max(1, (os.cpu_count() or 1) // size)
    torch.set_num_threads(threads)
    torch.manual_seed(1234)

    cuda = not args.no_cuda and torch.cuda.is_available()
    model, model_name = make_model(args.model, args.num_classes)
    if cuda:
        dev = rank % torch.cuda.device_count()
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
        model.cuda()
        model = DDP(model, device_ids=[dev])  # broadcasts rank 0's parameters
    else:
        model = DDP(model)
    if args.fp16_allreduce:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = optim.SGD(model.parameters(), lr=0.01 * size)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.LongTensor(args.batch_size).random_() % args.num_classes
    if cuda:
        data, target = data.cuda(), target.cuda()

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def timed_batches(n):
        for _ in range(n):
            benchmark_step()
        if cuda:
            torch.cuda.synchronize()

    def log(s):
        if rank == 0:
            print(s, flush=True)

    log("Model: %s" % model_name)
    log("Batch size: %d" % args.batch_size)
    log("Image size: %d, threads per rank: %d" % (args.image_size, threads))
    device = "GPU" if cuda else "CPU"
    log("Number of %ss: %d" % (device, size))
    log("Running warmup...")
    timeit.timeit(lambda: timed_batches(args.num_warmup_batches), number=1)
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(lambda: timed_batches(args.num_batches_per_iter), number=1)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, device))
        img_secs.append(img_sec)
    img_sec_mean = float(np.mean(img_secs))
    img_sec_conf = float(1.96 * np.std(img_secs))
    total = torch.tensor(img_sec_mean, dtype=torch.float64)
    dist.all_reduce(total)
    total = total.item()
    log("Img/sec per %s: %.1f +-%.1f" % (device, img_sec_mean, img_sec_conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f (measured sum over ranks: %.1f)"
        % (size, device, size * img_sec_mean, size * img_sec_conf, total))
    log("RESULT framework=ddp model=%s np=%d batch=%d image=%d img_sec_per_rank=%.2f "
        "img_sec_total=%.2f device=%s" % (model_name, size, args.batch_size, args.image_size,
                                          img_sec_mean, total, "cuda" if cuda else "cpu"))
    dist.barrier()
    # Leave without tearing the gloo group down: with torch 1.13 a rank can
    # block forever in the teardown once its peer is gone.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawned(rank, size, args):
    run(rank, size, args)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = parse_args()
    if args.np > 0:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(free_port())
        # mp.spawn joins every rank and raises if one fails (the others are
        # then terminated), so no process is left behind.
        mp.spawn(_spawned, args=(args.np, args), nprocs=args.np, join=True)
        return
    rank = int(os.environ.get("RANK", "0"))
    size = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()) if size == 1 else "29500")
    run(rank, size, args)


if __name__ == "__main__":
    main()
