"""Run under kolorun (any N >= 2): exercises every kolo.torch API function
and asserts its results on every rank, errors included. Prints
"WORKER-OK rank R" at the end; any failed check raises (non-zero exit).
"""

import math
import struct
import os
import sys
import warnings

import torch

import kolo
import kolo.torch as hvd

ALL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
              torch.uint8, torch.int32, torch.int64]


def expect_raises(exc, fn, *args, contains=None, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        if contains is not None:
            for c in ([contains] if isinstance(contains, str) else contains):
                assert c in str(e), "%r does not contain %r" % (str(e), c)
        return e
    raise AssertionError("%s did not raise %s" % (getattr(fn, "__name__", fn), exc.__name__))


def test_basics(r, n):
    assert hvd.is_initialized()
    assert 0 <= r < n and n >= 2
    ls, lr, cs, cr = hvd.local_size(), hvd.local_rank(), hvd.cross_size(), hvd.cross_rank()
    # kolorun places ranks on its nodes (agents) in contiguous, even blocks.
    assert 0 <= lr < ls <= n and 0 <= cr < cs <= n
    if hvd.is_homogeneous():
        assert ls * cs == n and r == cr * ls + lr, (r, ls, lr, cs, cr)
    topo = hvd.allgather_object((lr, ls, cr, cs))
    assert len({t[1] for t in topo}) >= 1 and sorted(t[2] for t in topo if t[0] == 0) == \
        list(range(topo[0][3]))
    assert kolo.rank() == r and kolo.size() == n
    assert hvd.library_path().endswith(".so") or "libkolo" in hvd.library_path()
    hvd.init()  # idempotent
    assert not hvd.mpi_built() and not hvd.gloo_built() and not hvd.nccl_built()


def test_allreduce(r, n):
    ranks = list(range(1, n + 1))
    # Every op on every dtype; small integers so every result is exact.
    for dt in ALL_DTYPES:
        base = torch.arange(6, dtype=torch.int64).reshape(2, 3) % 3 + 1
        x = (base * (r + 1)).to(dt)
        expect_sum = (base * sum(ranks)).to(dt)
        got = hvd.allreduce(x, op=hvd.Sum, name="sum.%s" % dt)
        assert got.dtype == dt and got.shape == x.shape and torch.equal(got, expect_sum), (dt, got)
        assert torch.equal(x, (base * (r + 1)).to(dt)), "out-of-place allreduce changed its input"
        got = hvd.allreduce(x, op=hvd.Min, name="min.%s" % dt)
        assert torch.equal(got, base.to(dt)), (dt, got)
        got = hvd.allreduce(x, op=hvd.Max, name="max.%s" % dt)
        assert torch.equal(got, (base * n).to(dt)), (dt, got)
        if dt not in (torch.int8, torch.uint8):  # products overflow 8 bits
            got = hvd.allreduce(x, op=hvd.Product, name="prod.%s" % dt)
            assert torch.equal(got, (base ** n * math.factorial(n)).to(dt)), (dt, got)
        if dt.is_floating_point:
            got = hvd.allreduce(x, name="avg.%s" % dt)  # Average is the default
            assert torch.allclose(got.double(), base.double() * sum(ranks) / n, rtol=1e-2), got

    x = torch.full((5,), float(r + 1))
    # prescale / postscale, and the deprecated average= argument.
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5, name="scale")
    assert torch.allclose(got, torch.full((5,), float(sum(ranks))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = hvd.allreduce(x, average=False, name="legacy")
    assert torch.equal(got, torch.full((5,), float(sum(ranks))))
    expect_raises(ValueError, hvd.allreduce, x, average=True, op=hvd.Sum)
    # fp16 compression on the wire, float32 in and out.
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16, name="fp16")
    assert got.dtype == torch.float32 and torch.equal(got, torch.full((5,), float(sum(ranks))))

    # In place, async, poll.
    y = torch.full((3, 4), float(r + 1))
    out = hvd.allreduce_(y, op=hvd.Sum, name="inplace")
    assert out is y and torch.equal(y, torch.full((3, 4), float(sum(ranks))))
    h = hvd.allreduce_async(torch.full((1000,), float(r)), op=hvd.Max, name="async")
    while not hvd.poll(h):
        pass
    assert hvd.poll(h)
    assert torch.equal(hvd.synchronize(h), torch.full((1000,), float(n - 1)))
    expect_raises(ValueError, hvd.synchronize, h, contains="unknown handle")
    y = torch.full((7,), 2.0 * (r + 1))
    h = hvd.allreduce_async_(y, name="async_")
    assert hvd.synchronize(h) is y and torch.allclose(y, torch.full((7,), 2.0 * sum(ranks) / n))
    y = torch.ones(4)
    h = hvd.allreduce_async_(y, op=hvd.Sum, compression=hvd.Compression.fp16, name="async_fp16")
    assert hvd.synchronize(h) is y and torch.equal(y, torch.full((4,), float(n)))

    # Non-contiguous tensors, scalars, empty tensors, > 8 dims.
    m = (torch.arange(12.0).reshape(3, 4) * (r + 1)).t()
    assert not m.is_contiguous()
    got = hvd.allreduce(m, op=hvd.Sum, name="noncontig")
    assert torch.equal(got, torch.arange(12.0).reshape(3, 4).t() * sum(ranks))
    hvd.allreduce_(m, op=hvd.Sum, name="noncontig_")
    assert torch.equal(m, torch.arange(12.0).reshape(3, 4).t() * sum(ranks))
    s = hvd.allreduce(torch.tensor(float(r + 1)), op=hvd.Sum, name="scalar")
    assert s.dim() == 0 and s.item() == sum(ranks)
    assert hvd.allreduce(torch.zeros(0, 3), name="empty").shape == (0, 3)
    big = torch.ones([1] * 9 + [2])
    assert torch.equal(hvd.allreduce(big, op=hvd.Sum, name="ninedims"), big * n)
    long_name = "x" * 400
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name=long_name), torch.full((2,), float(n)))

    # Unnamed ops (per-kind counters) and autograd.
    for _ in range(3):
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))
    w = torch.full((3,), float(r + 1), requires_grad=True)
    out = hvd.allreduce(w, op=hvd.Sum, name="grad")
    (out * (r + 1)).sum().backward()  # d/dw_r = sum over ranks of (q+1)
    assert torch.equal(w.grad, torch.full((3,), float(sum(ranks))))
    w = torch.full((3,), float(r + 1), requires_grad=True)
    out = hvd.allreduce(w, op=hvd.Sum, name="grad_fp16", compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32 and out.requires_grad
    (out * (r + 1)).sum().backward()
    assert torch.equal(w.grad, torch.full((3,), float(sum(ranks))))

    # Shared (zero-copy) tensors.
    z = hvd.shared_zeros(256, dtype=torch.float32)
    assert hvd.is_shared(z) and not hvd.is_shared(torch.zeros(3))
    z.fill_(r + 1)
    hvd.allreduce_(z, op=hvd.Sum, name="shared")
    assert torch.equal(z, torch.full((256,), float(sum(ranks))))
    z2 = hvd.to_shared(torch.full((4, 4), float(r + 1)))
    got = hvd.allreduce(z2, op=hvd.Sum, name="shared_oop")
    assert torch.equal(got, torch.full((4, 4), float(sum(ranks))))
    assert torch.equal(z2, torch.full((4, 4), float(r + 1))), "out-of-place changed a shared input"
    e = hvd.shared_empty(3, 5, dtype=torch.float64)
    assert e.shape == (3, 5) and e.dtype == torch.float64 and hvd.is_shared(e)


def test_grouped(r, n):
    ranks = sum(range(1, n + 1))
    ts = [torch.full((i + 1,), float(r + 1)) for i in range(4)] + [torch.ones(2, 2, dtype=torch.int32)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="g")
    assert len(outs) == 5
    for i in range(4):
        assert torch.equal(outs[i], torch.full((i + 1,), float(ranks)))
    assert torch.equal(outs[4], torch.full((2, 2), n, dtype=torch.int32))
    assert torch.equal(ts[0], torch.full((1,), float(r + 1)))
    res = hvd.grouped_allreduce_(ts, op=hvd.Sum, name="g_")
    assert all(a is b for a, b in zip(res, ts)) and torch.equal(ts[3], torch.full((4,), float(ranks)))
    h = hvd.grouped_allreduce_async([torch.ones(3), torch.ones(1)], op=hvd.Max)
    assert [t.tolist() for t in hvd.synchronize(h)] == [[1.0] * 3, [1.0]]
    ts = [torch.full((2,), float(r)), torch.full((3,), float(r))]
    h = hvd.grouped_allreduce_async_(ts, name="ga_")
    hvd.synchronize(h)
    assert torch.allclose(ts[1], torch.full((3,), (n - 1) / 2.0))
    assert hvd.grouped_allreduce([], name="empty_group") == []


def test_allgather(r, n):
    t = torch.arange(r + 1, dtype=torch.float32).reshape(r + 1, 1).repeat(1, 3) + 10 * r
    got = hvd.allgather(t, name="ag")
    want = torch.cat([torch.arange(q + 1, dtype=torch.float32).reshape(q + 1, 1).repeat(1, 3) + 10 * q
                      for q in range(n)])
    assert torch.equal(got, want), got
    h = hvd.allgather_async(torch.tensor([r], dtype=torch.int64), name="ag_async")
    assert hvd.synchronize(h).tolist() == list(range(n))
    # Every dtype, bit for bit (negative zero and NaN payloads survive).
    special = torch.tensor([-0.0, float("nan"), float("inf"), -1.5])
    g = hvd.allgather(special, name="ag_special")
    assert g.view(torch.int32).tolist() == special.view(torch.int32).tolist() * n
    b = hvd.allgather(torch.tensor([r % 2 == 0, True]), name="ag_bool")
    assert b.dtype == torch.bool and b.tolist() == sum(([q % 2 == 0, True] for q in range(n)), [])
    odd = torch.arange(3 * (r + 1), dtype=torch.uint8).reshape(r + 1, 3)  # 3-byte rows
    assert hvd.allgather(odd, name="ag_u8").shape == (sum(range(1, n + 1)), 3)
    # A rank with zero rows.
    z = torch.ones(0 if r == 0 else 2, 2)
    assert hvd.allgather(z, name="ag_zero").shape == (2 * (n - 1), 2)
    outs = hvd.grouped_allgather([torch.full((1,), r), torch.full((2, 2), float(r))], name="gag")
    assert outs[0].tolist() == list(range(n)) and outs[1].shape == (2 * n, 2)
    h = hvd.grouped_allgather_async([torch.full((1,), r)])
    assert hvd.synchronize(h)[0].tolist() == list(range(n))
    # Autograd through allgather.
    w = torch.full((2, 2), float(r + 1), requires_grad=True)
    hvd.allgather(w, name="ag_grad").sum().backward()
    assert torch.allclose(w.grad, torch.ones(2, 2))
    expect_raises(ValueError, hvd.allgather, torch.tensor(1.0), contains="scalar")


def test_broadcast(r, n):
    root = n - 1
    src = torch.arange(6, dtype=torch.float64).reshape(2, 3) * (r + 1)
    got = hvd.broadcast(src, root_rank=root, name="bc")
    assert torch.equal(got, torch.arange(6, dtype=torch.float64).reshape(2, 3) * n)
    assert torch.equal(src, torch.arange(6, dtype=torch.float64).reshape(2, 3) * (r + 1))
    t = torch.full((5,), r, dtype=torch.int64)
    assert hvd.broadcast_(t, 0, name="bc_") is t and t.tolist() == [0] * 5
    h = hvd.broadcast_async(torch.full((3,), float(r)), 1, name="bc_async")
    assert hvd.synchronize(h).tolist() == [1.0] * 3
    t = torch.full((3,), float(r))
    h = hvd.broadcast_async_(t, 1, name="bc_async_")
    assert hvd.synchronize(h) is t and t.tolist() == [1.0] * 3
    # Bit-exact for every dtype, including -0.0 and NaN payloads.
    nan_payload = struct.unpack("<f", struct.pack("<I", 0x7fc01234))[0]
    special = torch.tensor([-0.0, nan_payload, float("-inf"), 1e-40]) if r == 0 else torch.zeros(4)
    got = hvd.broadcast(special, 0, name="bc_special")
    assert got.view(torch.int32).tolist() == [-2147483648, 0x7fc01234, -8388608, 71362]
    for dt in ALL_DTYPES + [torch.bool, torch.int16, torch.complex64]:
        v = (torch.arange(7) % 2).to(dt) if r == 0 else torch.zeros(7, dtype=dt)
        assert torch.equal(hvd.broadcast(v, 0, name="bc.%s" % dt), (torch.arange(7) % 2).to(dt))
    buf = torch.full((9,), r, dtype=torch.uint8)
    view = buf[1:9]  # 8 bytes at an odd address: broadcast through an aligned copy
    hvd.broadcast_(view, 1, name="bc_unaligned")
    assert buf.tolist() == [r] + [1] * 8
    s = hvd.broadcast(torch.tensor(float(r) + 0.5), root, name="bc_scalar")
    assert s.dim() == 0 and s.item() == root + 0.5
    m = (torch.arange(6.0).reshape(2, 3) + r).t()
    hvd.broadcast_(m, 0, name="bc_noncontig")
    assert torch.equal(m, torch.arange(6.0).reshape(2, 3).t())
    # Autograd: the root receives the averaged gradient, the others zero.
    w = torch.full((2,), float(r), requires_grad=True)
    hvd.broadcast(w, 0, name="bc_grad").sum().backward()
    assert w.grad.tolist() == ([1.0, 1.0] if r == 0 else [0.0, 0.0])
    expect_raises(ValueError, hvd.broadcast, t, n, contains="root_rank")
    expect_raises(ValueError, hvd.broadcast_, t, -1)


def test_parameters_and_objects(r, n):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(r + 1)
    model[1].num_batches_tracked.fill_(10 + r)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert all(torch.equal(p, torch.ones_like(p)) for p in model.parameters())
    assert model[1].num_batches_tracked.item() == 10
    with torch.no_grad():
        model[0].weight.fill_(r)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=n - 1)
    assert torch.equal(model[0].weight, torch.full((4, 3), float(n - 1)))
    hvd.broadcast_parameters([model[0].bias], root_rank=0)
    expect_raises(ValueError, hvd.broadcast_parameters, 42, 0)

    # Optimizer state: only the root has stepped; afterwards all equal it.
    lin = torch.nn.Linear(4, 2)
    hvd.broadcast_parameters(lin.state_dict(), 0)
    opt = torch.optim.Adam(lin.parameters(), lr=0.01 * (r + 1))
    if r == 0:
        for _ in range(2):
            lin(torch.ones(1, 4)).sum().backward()
            opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01
    states = hvd.allgather_object({k: [v.tolist() if torch.is_tensor(v) else v
                                       for v in st.values()]
                                   for k, st in enumerate(opt.state.values())})
    assert all(s == states[0] for s in states) and len(states[0]) == 2, states
    # A fresh optimizer is initialized as Horovod does: zero gradients and
    # one local step (SGD with momentum: zero momentum buffers, the
    # parameters unchanged).
    before = [p.detach().clone() for p in lin.parameters()]
    opt2 = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(opt2, 0)
    assert len(opt2.state) == 2
    assert all(torch.equal(s["momentum_buffer"], torch.zeros_like(p))
               for p, s in opt2.state.items())
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in lin.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, lin.parameters()))
    expect_raises(ValueError, hvd.broadcast_optimizer_state,
                  torch.optim.LBFGS(lin.parameters()), 0)

    obj = {"rank": r, "list": [1, 2, 3], "text": "é" * r}
    got = hvd.broadcast_object(obj, root_rank=n - 1)
    assert got == {"rank": n - 1, "list": [1, 2, 3], "text": "é" * (n - 1)}
    assert hvd.broadcast_object(None, 0) is None
    assert hvd.allgather_object(("r", r)) == [("r", q) for q in range(n)]
    assert hvd.allgather_object("x" * (1000 * r), name="big") == ["x" * (1000 * q) for q in range(n)]


def test_sparse_and_optimizer(r, n):
    idx = torch.tensor([[r, n]])
    sp = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0]), (n + 1,))
    got = hvd.synchronize(hvd.sparse_allreduce_async(sp, name="sparse", op=hvd.Sum)).to_dense()
    want = torch.zeros(n + 1)
    want[:n] = 1.0
    want[n] = 2.0 * n
    assert torch.equal(got, want), got

    # Sparse embedding gradients through DistributedOptimizer, both ways.
    for sparse_as_dense in (False, True):
        emb = torch.nn.Embedding(n + 1, 2, sparse=True)
        hvd.broadcast_parameters(emb.state_dict(), 0)
        before = emb.weight.detach().clone()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        emb(torch.tensor([r])).sum().backward()
        opt.step()
        delta = (before - emb.weight.detach())
        # Each of rows 0..n-1 got gradient 1 from one rank: averaged 1/n.
        assert torch.allclose(delta[:n], torch.full((n, 2), 1.0 / n)), delta
        assert torch.equal(delta[n], torch.zeros(2))
        allw = hvd.allgather(emb.weight.detach().reshape(1, -1), name="emb.%d" % sparse_as_dense)
        assert all(torch.equal(allw[0], allw[q]) for q in range(n))

    # Parameters that get no gradient on some ranks, skip_synchronize, errors.
    lin = torch.nn.Linear(2, 2)
    extra = torch.nn.Parameter(torch.zeros(2))
    hvd.broadcast_parameters(lin.state_dict(), 0)
    params = list(lin.parameters()) + [extra]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1.0),
                                   named_parameters=list(lin.named_parameters()) + [("extra", extra)])
    loss = lin(torch.ones(1, 2)).sum()
    if r == 0:
        loss = loss + extra.sum()
    loss.backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    assert torch.allclose(extra.detach(), torch.full((2,), -1.0 / n))
    expect_raises(ValueError, hvd.DistributedOptimizer, torch.optim.SGD(lin.parameters(), lr=1.0),
                  named_parameters=[("a", lin.weight)], contains="not in it")
    expect_raises(ValueError, hvd.DistributedOptimizer, torch.optim.SGD(lin.parameters(), lr=1.0),
                  named_parameters=[("a", lin.weight), ("a", lin.bias)], contains="unique")
    expect_raises(ValueError, hvd.DistributedOptimizer, torch.optim.SGD(lin.parameters(), lr=1.0),
                  op=hvd.Sum, gradient_predivide_factor=2.0)
    if hvd.size() > 1:  # (Adasum itself: adasum_worker.py)
        expect_raises(ValueError, hvd.DistributedOptimizer,
                      torch.optim.SGD(lin.parameters(), lr=1.0), op=hvd.Adasum, groups=1,
                      contains="do not apply")
    # zero_grad between backward and step is refused.
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=1.0),
                                   named_parameters=lin.named_parameters())
    lin(torch.ones(1, 2)).sum().backward()
    expect_raises(AssertionError, opt.zero_grad)
    opt.step()
    opt.zero_grad()


def test_errors_and_unsupported(r, n):
    # Arguments refused before anything is submitted.
    expect_raises(ValueError, hvd.allreduce, torch.ones(2, dtype=torch.int16), contains="int16")
    expect_raises(ValueError, hvd.allreduce, [1, 2], contains="torch.Tensor")
    expect_raises(ValueError, hvd.allreduce, torch.ones(2), op=42)
    expect_raises(ValueError, hvd.allreduce, torch.ones(2).to_sparse())
    expect_raises(hvd.KoloNotImplementedError, hvd.grouped_allreduce, [torch.ones(2)],
                  op=hvd.Adasum, contains="Adasum in grouped_allreduce")
    # A name already in flight (no other rank has submitted "dup.<r>" yet, so
    # it cannot have completed).
    h = hvd.allreduce_async(torch.ones(3), name="dup.%d" % r)
    expect_raises(ValueError, hvd.allreduce_async, torch.ones(3), name="dup.%d" % r,
                  contains="same name")
    hvd.barrier()  # every rank has checked before anyone submits the others' names
    hs = [h] + [hvd.allreduce_async(torch.ones(3), name="dup.%d" % q) for q in range(n) if q != r]
    for h in hs:
        hvd.synchronize(h)
    # Mismatches across ranks fail on every rank with the agent's message.
    e = expect_raises(hvd.KoloInternalError, hvd.allreduce, torch.zeros(4 + r), name="mm_shape",
                      contains=["Mismatched", "shape"])
    assert isinstance(e, hvd.HorovodInternalError) and e.code is not None
    expect_raises(hvd.KoloInternalError, hvd.allreduce,
                  torch.zeros(4, dtype=torch.float32 if r == 0 else torch.float64),
                  name="mm_dtype", contains="Mismatched")
    expect_raises(hvd.KoloInternalError, hvd.allreduce, torch.zeros(4),
                  op=hvd.Sum if r == 0 else hvd.Max, name="mm_op", contains="Mismatched")
    expect_raises(hvd.KoloInternalError, hvd.allgather, torch.zeros(2, 2 + r), name="mm_ag",
                  contains="Mismatched")
    h = hvd.allreduce_async_(torch.zeros(2 + r), name="mm_async")
    expect_raises(hvd.KoloInternalError, hvd.synchronize, h, contains="Mismatched")
    # ... and the job goes on.
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after"), torch.full((2,), float(n)))

    # (SyncBatchNorm: workers/sync_bn_worker.py; Adasum still raises, above.)
    # join (uneven inputs): rank r has data for steps 0..r, then joins; at
    # step s the n - s ranks still in contribute, the joined ones count as
    # zeros. Every rank learns the last rank to join (n - 1). Twice, to
    # show a job goes on after a join round.
    for rnd in range(2):
        for step in range(r + 1):
            got = hvd.allreduce(torch.full((3,), float(step + 1)), op=hvd.Sum,
                                name="join.r%d.s%d" % (rnd, step))
            assert torch.equal(got, torch.full((3,), float((n - step) * (step + 1)))), (rnd, step, got)
            avg = hvd.allreduce(torch.ones(2), name="join.avg.r%d.s%d" % (rnd, step))
            assert torch.allclose(avg, torch.full((2,), (n - step) / n)), (rnd, step, avg)
        last = hvd.join()
        assert last == n - 1, (rnd, last)
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.join"),
                       torch.full((2,), float(n)))

    # The agent's timeline, switched on and off from the API (local rank 0
    # sends it): the file is valid JSON holding this job's allreduce.
    # "%a" gives each agent its own file (several agents share this host).
    # A relative name: kolorun's embedded agents write timelines in the
    # directory kolorun was started from (their --timeline-dir), which is
    # this worker's working directory too.
    tl_pattern = "kolo-api-timeline-%d-%%a.json" % os.getppid()
    hvd.start_timeline(tl_pattern, mark_cycles=True)
    hvd.barrier()
    hvd.allreduce(torch.ones(3), name="timeline.probe")
    hvd.barrier()
    hvd.stop_timeline()
    hvd.barrier()
    if r == 0:
        import glob
        import json
        import time
        deadline = time.monotonic() + 10
        files, procs = [], set()
        while time.monotonic() < deadline:
            files = glob.glob(tl_pattern.replace("%a", "*"))
            procs = set()
            try:
                for fn in files:
                    with open(fn) as f:
                        doc = json.load(f)
                    procs |= {fn + ":" + e["args"]["name"] for e in doc["traceEvents"]
                              if e.get("name") == "process_name"}
            except (OSError, ValueError):
                procs = set()
            if len(files) == hvd.cross_size() and \
                    sum("timeline.probe" in p for p in procs) == hvd.cross_size():
                break
            time.sleep(0.05)  # the agents apply and flush on their own threads
        assert len(files) == hvd.cross_size(), files
        assert sum("timeline.probe" in p for p in procs) == hvd.cross_size(), sorted(procs)
        for fn in files:
            os.unlink(fn)
    hvd.barrier()
    # A timeline that cannot be written where asked is the caller's error,
    # naming the folder where it can be written (the agent's --timeline-dir:
    # kolorun's directory for its embedded agents).
    if hvd.local_rank() == 0:
        from kolo.errors import KoloInternalError
        try:
            hvd.start_timeline("/proc/kolo-no-such-dir/tl.json")
        except KoloInternalError as e:
            assert "'/proc/kolo-no-such-dir/tl.json' is outside the timeline directory" in str(e), str(e)
            assert "this agent writes timelines only inside " + os.getcwd() in str(e), str(e)
        else:
            raise AssertionError("start_timeline outside the agent's timeline directory returned")
    hvd.barrier()
    out, recv = hvd.alltoall(torch.full((n,), r), splits=[1] * n, name="a2a_smoke")
    assert out.tolist() == list(range(n)) and recv.tolist() == [1] * n
    got = hvd.reducescatter(torch.ones(n, 2), op=hvd.Sum, name="rs_smoke")
    assert torch.equal(got, torch.full((1, 2), float(n)))

    # Process sets (the rest in process_sets_worker.py): the global set; an
    # unregistered ProcessSet of every rank acts as it, and adding one is
    # refused on every rank with libkolo's message; other unregistered sets
    # cannot be used.
    assert hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r
    assert hvd.global_process_set.ranks == list(range(n))
    everyone = hvd.ProcessSet(range(n))
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=everyone, name="ps"),
                       torch.full((1,), float(n)))
    expect_raises(ValueError, hvd.add_process_set, everyone,
                  contains="that is the global process set (0)")
    assert everyone.process_set_id is None
    expect_raises(ValueError, hvd.allreduce, torch.ones(1), process_set=hvd.ProcessSet([0]),
                  contains="not registered")
    assert hvd.remove_process_set(hvd.global_process_set) is False
    expect_raises(ValueError, hvd.init, comm=[0])


def main():
    torch.set_num_threads(1)
    expect_raises(ValueError, hvd.rank, contains="init")
    expect_raises(ValueError, hvd.allreduce, torch.ones(1), contains="init")
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for test in [test_basics, test_allreduce, test_grouped, test_allgather, test_broadcast,
                 test_parameters_and_objects, test_sparse_and_optimizer,
                 test_errors_and_unsupported]:
        test(r, n)
        hvd.barrier()
        print("passed %s" % test.__name__, flush=True)
    # Shutting down fails what is still pending (no other rank submits this name).
    h = hvd.allreduce_async(torch.ones(2), name="pending.%d" % r)
    hvd.shutdown()
    expect_raises(hvd.KoloInternalError, hvd.synchronize, h)
    assert not hvd.is_initialized()
    expect_raises(ValueError, hvd.size)
    hvd.shutdown()  # idempotent
    print("WORKER-OK rank %d" % r)


if __name__ == "__main__":
    sys.exit(main())
