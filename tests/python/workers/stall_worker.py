"""Run under kolorun -np 2: the ranks call allreduce under different names
(Horovod's name-mismatch trap), so each waits for the other forever. The
agent's stall report must reach the ranks' stderr, and the stall shutdown
time must end the job with that text. Each rank prints
"GOT-ERROR <seconds> <message>" when its collective fails."""

import time

import torch

import kolo.torch as hvd

hvd.init()
assert hvd.size() == 2
hvd.barrier()
name = "grad.weight" if hvd.rank() == 0 else "grad.bias"
t0 = time.monotonic()
try:
    hvd.allreduce(torch.ones(4), name=name)
    print("UNEXPECTED-SUCCESS", flush=True)
except Exception as e:  # HorovodInternalError (shutdown) or a timeout
    print("GOT-ERROR %.2f %s" % (time.monotonic() - t0, str(e).replace("\n", " | ")), flush=True)
