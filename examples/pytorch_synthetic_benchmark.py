#!/usr/bin/env python3
"""Synthetic training throughput with kolo, in the shape of Horovod's
examples/pytorch/pytorch_synthetic_benchmark.py (same options and output).

    kolorun -np 2 python3 examples/pytorch_synthetic_benchmark.py --model resnet18

Models are torchvision's (any name of torchvision.models; without torchvision
that is an error, never a silent swap), or with --model convnet a small
ResNet-style network defined in synthetic_models.py. As in Horovod, it trains on the GPU when CUDA
is available (each rank on GPU local_rank % device_count; --no-cuda: CPU).
--no-allreduce trains without any gradient exchange (a plain optimizer): the
compute-only ceiling of the same processes. --image-size (default 224, as Horovod) and
--num-threads are extra knobs for small CPU machines. The last line,
"RESULT ...", is for examples/compare_ddp.sh.

Total img/sec is measured: the sum over ranks of each rank's mean (Horovod
prints size x rank 0's mean; both are shown).
"""

import argparse
import os
import sys
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

import kolo.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_models import make_model  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark (kolo)",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", type=str, default="resnet50", help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=10,
                        help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true", default=False,
                        help="disables CUDA training")
    parser.add_argument("--no-allreduce", action="store_true", default=False,
                        help="no gradient allreduce (plain optimizer): the compute-only ceiling")
    parser.add_argument("--use-adasum", action="store_true", default=False,
                        help="use adasum algorithm to do reduction")
    parser.add_argument("--image-size", type=int, default=224, help="input height and width")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--num-threads", type=int, default=0,
                        help="torch threads per rank (0: cores / local ranks)")
    parser.add_argument("--zero-copy", action="store_true", default=False,
                        help="gradients in agent-shared memory (gradient_as_bucket_view)")
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    if args.cuda:
        # Horovod: pin to GPU local_rank (here modulo the GPUs: several ranks
        # may share one).
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        torch.backends.cudnn.benchmark = True
    threads = args.num_threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
    torch.set_num_threads(threads)
    torch.manual_seed(1234)

    model, model_name = make_model(args.model, args.num_classes)
    if args.cuda:
        model.cuda()
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    if not args.no_allreduce:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression,
                                             op=hvd.Adasum if args.use_adasum else hvd.Average,
                                             gradient_as_bucket_view=args.zero_copy)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.LongTensor(args.batch_size).random_() % args.num_classes
    if args.cuda:
        data, target = data.cuda(), target.cuda()

    def benchmark_step():
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()

    def timed_batches(n):
        for _ in range(n):
            benchmark_step()
        if args.cuda:
            torch.cuda.synchronize()  # the GPU's work is part of the time

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    log("Model: %s" % model_name)
    log("Batch size: %d" % args.batch_size)
    device = "GPU" if args.cuda else "CPU"
    log("Image size: %d, threads per rank: %d, zero copy: %s, allreduce: %s"
        % (args.image_size, threads, args.zero_copy, not args.no_allreduce))
    log("Number of %ss: %d" % (device, hvd.size()))

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
    total = hvd.allreduce(torch.tensor(img_sec_mean, dtype=torch.float64), op=hvd.Sum,
                          name="img_sec_total").item()
    log("Img/sec per %s: %.1f +-%.1f" % (device, img_sec_mean, img_sec_conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f (measured sum over ranks: %.1f)"
        % (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf, total))
    log("RESULT framework=kolo model=%s np=%d batch=%d image=%d img_sec_per_rank=%.2f "
        "img_sec_total=%.2f device=%s allreduce=%s"
        % (model_name, hvd.size(), args.batch_size, args.image_size, img_sec_mean, total,
           "cuda" if args.cuda else "cpu", "off" if args.no_allreduce else "on"))


if __name__ == "__main__":
    main()
