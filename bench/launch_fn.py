"""The function bench/launch_overhead.py times: the first allreduce's wall
time, then the mean time of `steps` small allreduces (a training step's
collective on a 1 MB gradient). Under kolorun: launch_fn.py STEPS OUTDIR."""

import json
import os
import sys
import time


def steps_fn(steps):
    import torch
    import kolo.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    g = torch.ones(256 * 1024)
    hvd.allreduce(g, name="first")
    first = time.time()
    t0 = time.perf_counter()
    for i in range(steps):
        hvd.allreduce(g, name="step")
    per_step = (time.perf_counter() - t0) / steps
    hvd.barrier()
    hvd.shutdown()
    return {"first": first, "per_step": per_step}


if __name__ == "__main__":
    r = steps_fn(int(sys.argv[1]))
    with open(os.path.join(sys.argv[2], "r%s.json" % os.environ["KOLO_RANK"]), "w") as f:
        json.dump(r, f)
