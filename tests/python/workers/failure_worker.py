"""Run under kolorun -np 2: rank 1 leaves the job early (clean shutdown,
exit 0); rank 0's next collective must fail promptly with KoloInternalError
instead of hanging. Rank 0 prints "GOT-ERROR <code> <seconds> <message>"."""

import time

import torch

import kolo.torch as hvd

hvd.init()
assert hvd.size() == 2
hvd.barrier()
if hvd.rank() == 1:
    hvd.shutdown()
    print("LEFT rank 1", flush=True)
else:
    t0 = time.monotonic()
    try:
        # A pending op and a new one: both must fail.
        h = hvd.allreduce_async(torch.ones(4), name="never")
        hvd.synchronize(h)
        print("UNEXPECTED-SUCCESS", flush=True)
    except hvd.HorovodInternalError as e:
        print("GOT-ERROR %s %.2f %s" % (e.code, time.monotonic() - t0, e), flush=True)
    try:
        hvd.allreduce(torch.ones(4), name="after")
        print("UNEXPECTED-SUCCESS-2", flush=True)
    except (hvd.KoloInternalError, ValueError) as e:
        print("GOT-ERROR-2 %s" % type(e).__name__, flush=True)
    hvd.shutdown()
