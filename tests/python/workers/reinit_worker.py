"""init -> collectives -> shutdown, N times in one process (Horovod allows
init after shutdown; its test suite and elastic reset rely on it).

argv: cycles [stagger]. With `stagger`, rank 0 re-inits at once after its
shutdown while the other ranks wait a moment before shutting down, so the
new session forms while the old one is still ending.
"""

import sys
import time

import torch

import kolo.torch as hvd

cycles = int(sys.argv[1])
stagger = len(sys.argv) > 2 and sys.argv[2] == "stagger"

first = None
for i in range(cycles):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if first is None:
        first = (rank, size, hvd.local_rank(), hvd.local_size())
    assert (rank, size, hvd.local_rank(), hvd.local_size()) == first, (i, first)
    # The same op names every cycle: a fresh session has no memory of them.
    x = torch.arange(5, dtype=torch.float32) * (rank + 1) + i
    got = hvd.allreduce(x, op=hvd.Sum, name="x")
    want = sum(torch.arange(5, dtype=torch.float32) * (r + 1) + i for r in range(size))
    assert torch.equal(got, want), (i, got, want)
    b = hvd.broadcast(torch.tensor([rank * 10 + i]), root_rank=size - 1, name="b")
    assert b.item() == (size - 1) * 10 + i, (i, b)
    members = [0, 1] if size > 2 else [1]  # (all ranks would be the global set)
    ps = hvd.add_process_set(members)
    if rank in members:
        y = hvd.allreduce(torch.tensor([float(rank + i)]), op=hvd.Sum, process_set=ps, name="y")
        assert y.item() == sum(m + i for m in members), (i, y)
    hvd.remove_process_set(ps)
    hvd.barrier()
    if stagger and rank != 0:
        time.sleep(0.5)
    hvd.shutdown()
    assert not hvd.is_initialized()
    try:
        hvd.rank()
        raise AssertionError("rank() after shutdown did not raise")
    except ValueError:
        pass
    print("CYCLE %d rank %d ok" % (i, rank), flush=True)

print("WORKER-OK rank %d" % first[0], flush=True)
