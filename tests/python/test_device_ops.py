"""Every kolo.torch op on each device (workers/device_ops_worker.py):

  cpu          CPU tensors
  staged       CPU tensors through the CUDA staging code (_cuda.staged), so
               its plumbing runs on machines without a GPU
  cuda         CUDA tensors (device path for allreduce, grouped_allreduce and
               broadcast; the rest staged through pinned host memory)
  cuda-staged  CUDA tensors with KOLO_DEVICE_ARENA_MB=0: every op staged
  cuda-zerocopy CUDA tensors with KOLO_DEVICE_ZERO_COPY=1: torch's allocator
               is the device arena's, device ops copy nothing (not run on a
               GPU yet)

The cuda cases skip where torch sees no GPU; bench/gpu_issue16.sh runs them
on the GPU machine (2 and 4 trainers sharing GPU 0, under CUDA MPS).
"""

import os

import pytest

from conftest import WORKERS

try:
    import torch
    _CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - conftest needs torch anyway
    _CUDA = False

NO_CUDA = "no CUDA device: torch.cuda.is_available() is False in %s" % (
    getattr(__import__("sys"), "executable", "python3"))


@pytest.mark.parametrize("np_,device", [(2, "cpu"), (2, "staged"), (2, "cuda"), (4, "cuda"),
                                        (2, "cuda-staged"), (2, "cuda-zerocopy")])
def test_every_op_on_the_device(kolorun, np_, device):
    if device.startswith("cuda") and not _CUDA:
        pytest.skip(NO_CUDA)
    env = {"KOLO_DEVICE_ARENA_MB": "0"} if device == "cuda-staged" else None
    if device == "cuda-zerocopy":
        env = {"KOLO_DEVICE_ZERO_COPY": "1", "KOLO_DEVICE_ARENA_MB": "8192"}
    mode = "cuda" if device.startswith("cuda") else device
    res = kolorun(np_, os.path.join(WORKERS, "device_ops_worker.py"), mode, timeout=300, env=env)
    assert res.rc == 0, res.describe()
    route = {"cuda": "device", "cuda-staged": "staged",
             "cuda-zerocopy": "device zero-copy"}.get(device, "host")
    for r in range(np_):
        lines = res.rank_lines(r)
        assert any(l.startswith("WORKER-OK rank %d %s %s" % (r, mode, route)) for l in lines), \
            res.describe()
