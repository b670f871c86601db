"""Run under kolorun: trains common_model.Net with kolo.torch for each
configuration named on the command line and saves every rank's final
parameters to OUTDIR/<config>.rank<r>.pt.

usage: train_worker.py OUTDIR CONFIG [CONFIG...]
"""

import os
import sys

import torch
import torch.nn.functional as F

import common_model as cm
import kolo.torch as hvd


def train(name, cfg, outdir):
    rank, size = hvd.rank(), hvd.size()
    # Every rank starts from different weights: broadcast_parameters must
    # make them all rank 0's (seed INIT_SEED), as in the reference.
    model = cm.make_model(cm.INIT_SEED + rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = cm.make_optimizer(cfg, model.parameters(), size)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    kwargs = dict(cfg.get("dist", {}))
    if kwargs.get("compression") == "fp16":
        kwargs["compression"] = hvd.Compression.fp16
    if kwargs.get("groups") == "by-layer":
        kwargs["groups"] = [[model.conv.weight, model.conv.bias],
                            [model.fc1.weight, model.fc1.bias, model.fc2.weight]]
    if cfg.get("op") == "Sum":
        kwargs["op"] = hvd.Sum
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kwargs)
    if kwargs.get("gradient_as_bucket_view"):
        assert all(hvd.is_shared(p.grad) for p in model.parameters()), "grads not in shared memory"

    for step in range(cm.STEPS):
        opt.zero_grad()
        for m in range(cfg.get("micro", 1)):
            x, y = cm.local_batch(step, m, size, rank)
            F.cross_entropy(model(x), y).backward()
        opt.step()
    if kwargs.get("gradient_as_bucket_view"):
        assert all(hvd.is_shared(p.grad) for p in model.parameters()), "grads left shared memory"
    torch.save(cm.flat_params(model), os.path.join(outdir, "%s.rank%d.pt" % (name, rank)))


def main():
    outdir, names = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(1)
    hvd.init()
    for name in names:
        train(name, cm.CONFIGS[name], outdir)
    hvd.barrier()
    rank = hvd.rank()
    hvd.shutdown()
    print("WORKER-OK rank %d" % rank)


if __name__ == "__main__":
    main()
