"""Run under kolorun (N >= 2): broadcast, allgather, alltoall and
reducescatter (plain, async, grouped, autograd) on the native C ABI, for
every dtype, uneven and empty first dimensions, against references this
script computes itself from every rank's input (each rank can rebuild any
rank's tensor: the inputs are seeded by rank). Every comparison is bit-exact
(torch.equal on the bytes). Errors: mismatches across ranks raise
KoloInternalError with the agent's message; bad arguments ValueError.
Prints "WORKER-OK rank R" at the end; a failed check raises.
"""

import sys

import torch

import kolo.torch as hvd

KOLO_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
               torch.uint8, torch.int32, torch.int64]
# broadcast, allgather and alltoall carry these too (as bytes).
CARRIED = KOLO_DTYPES + [torch.int16, torch.bool, torch.complex64, torch.complex128]


def make(q, shape, dt, salt):
    """Rank q's tensor: arbitrary bit patterns (every byte random), so a
    bit-exact comparison proves the bytes moved unchanged. Floats include
    NaNs with payloads, infinities, denormals and -0.0."""
    g = torch.Generator().manual_seed(7919 * q + salt)
    probe = torch.empty(0, dtype=dt)
    nbytes = int(torch.Size(shape).numel()) * probe.element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    if dt == torch.bool:
        raw = raw % 2
    return raw.view(dt).reshape(shape) if nbytes else torch.empty(shape, dtype=dt)


def small(q, shape, dt, salt):
    """Rank q's tensor of small integers (in dt): sums over <= 8 ranks are
    exact in every dtype, bf16 and int8 included, whatever the order."""
    g = torch.Generator().manual_seed(104729 * q + salt)
    lo = 0 if dt == torch.uint8 else -8
    return torch.randint(lo, 9, shape, dtype=torch.int64, generator=g).to(dt)


def same_bits(a, b):
    """Bit-exact equality (NaN payloads and -0.0 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    ab = a.contiguous().reshape(-1).view(torch.uint8) if a.dtype != torch.bool else a.reshape(-1)
    bb = b.contiguous().reshape(-1).view(torch.uint8) if b.dtype != torch.bool else b.reshape(-1)
    return torch.equal(ab, bb)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_raises(exc, fn, *args, contains=(), **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        for c in ([contains] if isinstance(contains, str) else contains):
            check(c in str(e), "%r does not contain %r" % (str(e), c))
        return e
    raise AssertionError("%s did not raise %s" % (getattr(fn, "__name__", fn), exc.__name__))


# --------------------------------------------------------------------------


def test_broadcast(r, n):
    for i, dt in enumerate(CARRIED):
        for shape in [(), (0,), (3, 5), (2, 1, 3)]:
            root = (i + len(shape)) % n
            want = make(root, shape, dt, i)
            mine = make(r, shape, dt, i)
            got = hvd.broadcast(mine, root, name="bc.%s.%s" % (dt, shape))
            check(same_bits(got, want), "broadcast %s %s from %d" % (dt, shape, root))
            check(same_bits(mine, make(r, shape, dt, i)), "broadcast changed its input")
            t = make(r, shape, dt, i)
            check(hvd.broadcast_(t, root, name="bc_.%s.%s" % (dt, shape)) is t, "broadcast_ result")
            check(same_bits(t, want), "broadcast_ %s %s" % (dt, shape))
    # Non-contiguous, in place, async.
    m = make(r, (4, 6), torch.float32, 99).t()
    h = hvd.broadcast_async_(m, n - 1, name="bc_noncontig")
    check(hvd.synchronize(h) is m and same_bits(m, make(n - 1, (4, 6), torch.float32, 99).t()),
          "non-contiguous broadcast_async_")
    h = hvd.broadcast_async(make(r, (5,), torch.int64, 3), 1, name="bc_async")
    while not hvd.poll(h):
        pass
    check(same_bits(hvd.synchronize(h), make(1, (5,), torch.int64, 3)), "broadcast_async")


def test_allgather(r, n):
    for i, dt in enumerate(CARRIED):
        for tail in [(), (3,), (2, 3), (0,)]:
            rows = [(q + i + len(tail)) % 3 for q in range(n)]  # uneven, zeros too
            ins = [make(q, (rows[q],) + tail, dt, 10 * i + len(tail)) for q in range(n)]
            got = hvd.allgather(ins[r], name="ag.%s.%s" % (dt, tail))
            want = torch.cat(ins)
            check(same_bits(got, want), "allgather %s tail %s rows %s" % (dt, tail, rows))
    # Every rank empty.
    got = hvd.allgather(torch.empty(0, 4, dtype=torch.float64), name="ag_all_empty")
    check(got.shape == (0, 4) and got.dtype == torch.float64, "allgather of nothing")
    # Non-contiguous input, > 8 dims, async and poll.
    x = make(r, (3, 2), torch.int32, 5).t()
    want = torch.cat([make(q, (3, 2), torch.int32, 5).t() for q in range(n)])
    check(same_bits(hvd.allgather(x, name="ag_noncontig"), want), "non-contiguous allgather")
    deep = make(r, (r + 1,) + (1,) * 8 + (2,), torch.float32, 6)
    want = torch.cat([make(q, (q + 1,) + (1,) * 8 + (2,), torch.float32, 6) for q in range(n)])
    check(same_bits(hvd.allgather(deep, name="ag_deep"), want), "10-dim allgather")
    h = hvd.allgather_async(make(r, (r,), torch.bfloat16, 7), name="ag_async")
    while not hvd.poll(h):
        pass
    want = torch.cat([make(q, (q,), torch.bfloat16, 7) for q in range(n)])
    check(same_bits(hvd.synchronize(h), want), "allgather_async")
    # Grouped: mixed dtypes and shapes, one native allgather each.
    ins = [[make(q, (q + 1, 2), torch.float16, 8) for q in range(n)],
           [make(q, (n - q,), torch.int64, 9) for q in range(n)],
           [make(q, (0 if q == 0 else 1, 3), torch.complex64, 10) for q in range(n)]]
    outs = hvd.grouped_allgather([ins[k][r] for k in range(3)], name="gag")
    check(len(outs) == 3 and all(same_bits(outs[k], torch.cat(ins[k])) for k in range(3)),
          "grouped_allgather")
    h = hvd.grouped_allgather_async([ins[1][r]])
    check(same_bits(hvd.synchronize(h)[0], torch.cat(ins[1])), "grouped_allgather_async")
    check(hvd.grouped_allgather([], name="gag_empty") == [], "empty group")
    # The async forms return at once (libkolo's size exchange runs on a thread
    # of its own): ranks may issue them in opposite orders.
    names = ["ag_order.a", "ag_order.b", "ag_order.c"]
    if r % 2:
        names.reverse()
    hs = [(nm, hvd.allgather_async(torch.full((1, 2), r), name=nm)) for nm in names]
    for nm, h in reversed(hs):
        check(hvd.synchronize(h)[:, 0].tolist() == list(range(n)), "allgather %s" % nm)


def a2a_splits(q, n, salt):
    return [(2 * q + d + salt) % 3 for d in range(n)]  # not symmetric in (q, d)


def a2a_reference(ins, splits, r):
    """What rank r receives: rank q's rows for r, from q = 0 up."""
    parts, recv = [], []
    for q, (x, sp) in enumerate(zip(ins, splits)):
        start = sum(sp[:r])
        parts.append(x.narrow(0, start, sp[r]))
        recv.append(sp[r])
    return torch.cat(parts), torch.tensor(recv, dtype=torch.int32)


def test_alltoall(r, n):
    for i, dt in enumerate(CARRIED):
        for tail in [(), (2, 3)]:
            splits = [a2a_splits(q, n, i) for q in range(n)]
            ins = [make(q, (sum(splits[q]),) + tail, dt, 20 * i + len(tail)) for q in range(n)]
            out, recv = hvd.alltoall(ins[r], splits=splits[r], name="a2a.%s.%s" % (dt, tail))
            want, want_recv = a2a_reference(ins, splits, r)
            check(same_bits(out, want), "alltoall %s tail %s splits %s" % (dt, tail, splits))
            check(recv.dtype == torch.int32 and torch.equal(recv, want_recv),
                  "received splits %s, want %s" % (recv.tolist(), want_recv.tolist()))
            # Even split (no splits): the output only, as with Horovod.
            even = [make(q, (2 * n,) + tail, dt, 30 * i) for q in range(n)]
            got = hvd.alltoall(even[r], name="a2a_even.%s.%s" % (dt, tail))
            check(torch.is_tensor(got), "alltoall without splits returns a tensor")
            check(same_bits(got, a2a_reference(even, [[2] * n] * n, r)[0]), "even alltoall %s" % dt)
    # Splits as a tensor, adding up to less than dim 0 (the rest is not sent).
    splits = [[1] * n for _ in range(n)]
    ins = [make(q, (n + 2, 2), torch.float32, 40) for q in range(n)]
    out, recv = hvd.alltoall(ins[r], splits=torch.tensor(splits[r], dtype=torch.int32),
                             name="a2a_short")
    check(same_bits(out, a2a_reference(ins, splits, r)[0]) and recv.tolist() == [1] * n,
          "alltoall with splits short of dim 0")
    # Everything empty; one rank sending nothing; async; non-contiguous.
    out, recv = hvd.alltoall(torch.empty(0, 3), splits=[0] * n, name="a2a_empty")
    check(out.shape == (0, 3) and recv.tolist() == [0] * n, "empty alltoall")
    splits = [[0] * n if q == 0 else [q] * n for q in range(n)]
    ins = [make(q, (sum(splits[q]),), torch.int8, 41) for q in range(n)]
    h = hvd.alltoall_async(ins[r], splits[r], name="a2a_async")
    while not hvd.poll(h):
        pass
    out, recv = hvd.synchronize(h)
    want, want_recv = a2a_reference(ins, splits, r)
    check(same_bits(out, want) and torch.equal(recv, want_recv), "alltoall_async")
    names = ["a2a_order.a", "a2a_order.b"]
    if r % 2:
        names.reverse()
    hs = [hvd.alltoall_async(torch.full((n,), r), name=nm) for nm in names]
    for h in hs:
        out, recv = hvd.synchronize(h)
        check(out.tolist() == list(range(n)) and recv.tolist() == [1] * n, "alltoall order")
    x = make(r, (3, 2 * n), torch.float64, 42).t()
    want = a2a_reference([make(q, (3, 2 * n), torch.float64, 42).t() for q in range(n)],
                         [[2] * n] * n, r)[0]
    check(same_bits(hvd.alltoall(x, name="a2a_noncontig"), want), "non-contiguous alltoall")
    # Autograd: the gradient goes back to where each row came from.
    w = torch.full((n, 2), float(r + 1), requires_grad=True)
    out, recv = hvd.alltoall(w, splits=[1] * n, name="a2a_grad")
    (out * torch.arange(1.0, n + 1).reshape(n, 1)).sum().backward()
    # Rank r's row d went to rank d, where it sat at row r and was weighted r + 1.
    check(torch.equal(w.grad, torch.full((n, 2), float(r + 1))), "alltoall gradient %s" % w.grad)
    # Local argument errors (the same on every rank: nothing is submitted).
    expect_raises(ValueError, hvd.alltoall, torch.ones(2 * n + 1), contains="divide evenly")
    expect_raises(ValueError, hvd.alltoall, torch.ones(4), splits=[1] * (n + 1),
                  contains="one per rank")
    expect_raises(ValueError, hvd.alltoall, torch.ones(4), splits=[5] + [0] * (n - 1),
                  contains="more than the first dimension")
    expect_raises(ValueError, hvd.alltoall, torch.ones(4), splits=[-1] + [0] * (n - 1),
                  contains="negative")
    expect_raises(ValueError, hvd.alltoall, torch.tensor(1.0), contains="scalar")


def block(full, n, r):
    d0 = full.shape[0]
    start = r * (d0 // n) + min(r, d0 % n)
    return full.narrow(0, start, d0 // n + (1 if r < d0 % n else 0))


def rs_reference(ins, op, n, pre=1.0, post=1.0):
    """The agent's arithmetic: inputs scaled in float64 and cast back, summed
    in their dtype (exact here), Average = sum * (1 / n) in float64 cast back
    (n is a power of two: exact; integers truncate), then postscale."""
    def scaled(t, f):
        return t if f == 1.0 else (t.to(torch.float64) * f).to(t.dtype)
    acc = scaled(ins[0], pre).clone()
    for x in ins[1:]:
        acc = acc + scaled(x, pre)
    if op == hvd.Average:
        acc = scaled(acc, 1.0 / n)
    return scaled(acc, post)


def test_reducescatter(r, n):
    for i, dt in enumerate(KOLO_DTYPES):
        for d0 in [2 * n + 1, n - 1, 0, 3 * n]:
            for op in (hvd.Sum, hvd.Average):
                tail = (3,) if d0 % 2 else (2, 2)
                ins = [small(q, (d0,) + tail, dt, 50 * i + d0) for q in range(n)]
                got = hvd.reducescatter(ins[r], op=op, name="rs.%s.%d.%d" % (dt, d0, op))
                want = block(rs_reference(ins, op, n), n, r)
                check(same_bits(got, want), "reducescatter %s d0=%d op=%d: %s vs %s"
                      % (dt, d0, op, got.tolist(), want.tolist()))
    # Average is the default; prescale/postscale (floats and integers).
    ins = [small(q, (2 * n, 3), torch.float32, 60) for q in range(n)]
    got = hvd.reducescatter(ins[r], name="rs_default")
    check(same_bits(got, block(rs_reference(ins, hvd.Average, n), n, r)), "default op")
    got = hvd.reducescatter(ins[r], op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25,
                            name="rs_scale")
    check(same_bits(got, block(rs_reference(ins, hvd.Sum, n, 2.0, 0.25), n, r)), "scaled")
    ints = [small(q, (n + 1,), torch.int32, 61) for q in range(n)]
    got = hvd.reducescatter(ints[r], op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5,
                            name="rs_scale_int")
    check(same_bits(got, block(rs_reference(ints, hvd.Average, n, 3.0, 0.5), n, r)),
          "scaled int32 %s" % got.tolist())
    # fp16 compression: float32 in and out, float16 on the wire.
    got = hvd.reducescatter(ins[r], op=hvd.Sum, compression=hvd.Compression.fp16, name="rs_fp16")
    check(got.dtype == torch.float32 and same_bits(got, block(rs_reference(ins, hvd.Sum, n), n, r)),
          "fp16 compression")
    # Async, non-contiguous, grouped.
    x = small(r, (3, 2 * n), torch.int64, 62).t()
    h = hvd.reducescatter_async(x, op=hvd.Sum, name="rs_async")
    while not hvd.poll(h):
        pass
    want = block(rs_reference([small(q, (3, 2 * n), torch.int64, 62).t() for q in range(n)],
                              hvd.Sum, n), n, r)
    check(same_bits(hvd.synchronize(h), want), "non-contiguous reducescatter_async")
    groups = [[small(q, (n + 2,), torch.bfloat16, 63) for q in range(n)],
              [small(q, (1, 4), torch.int8, 64) for q in range(n)]]
    outs = hvd.grouped_reducescatter([g[r] for g in groups], op=hvd.Sum, name="grs")
    check(len(outs) == 2 and all(same_bits(o, block(rs_reference(g, hvd.Sum, n), n, r))
                                 for o, g in zip(outs, groups)), "grouped_reducescatter")
    h = hvd.grouped_reducescatter_async([g[r] for g in groups], op=hvd.Average)
    outs = hvd.synchronize(h)
    check(all(same_bits(o, block(rs_reference(g, hvd.Average, n), n, r))
              for o, g in zip(outs, groups)), "grouped_reducescatter_async")
    # Autograd: the gradient of the block is gathered back, as in Horovod
    # (Average: as is; Sum: times the size).
    w = torch.full((2 * n, 2), float(r), requires_grad=True)
    hvd.reducescatter(w, op=hvd.Average, name="rs_grad").sum().backward()
    check(torch.equal(w.grad, torch.full((2 * n, 2), 1.0)), "reducescatter grad %s" % w.grad)
    w = torch.full((2 * n, 2), float(r), requires_grad=True)
    hvd.reducescatter(w, op=hvd.Sum, name="rs_grad_sum").sum().backward()
    check(torch.equal(w.grad, torch.full((2 * n, 2), float(n))), "reducescatter grad (Sum) %s" % w.grad)
    # Local argument errors.
    expect_raises(ValueError, hvd.reducescatter, torch.ones(4), op=hvd.Max, contains="Average or Sum")
    expect_raises(ValueError, hvd.reducescatter, torch.tensor(1.0), contains="scalar")
    expect_raises(ValueError, hvd.reducescatter, torch.ones(4, dtype=torch.int16),
                  contains="int16")
    expect_raises(hvd.KoloNotImplementedError, hvd.reducescatter, torch.ones(4), op=hvd.Adasum)


def test_mismatches(r, n):
    """Disagreements across ranks fail the op on every rank with the agent's
    message; the job goes on."""
    e = expect_raises(hvd.KoloInternalError, hvd.allgather, torch.zeros(2, 2 + r), name="mm_ag",
                      contains=["Mismatched allgather tensor shapes", "'allgather.mm_ag'",
                                "all dimensions but the first must match"])
    check(isinstance(e, hvd.HorovodInternalError) and e.code == 2, "code %r" % e.code)
    expect_raises(hvd.KoloInternalError, hvd.allgather,
                  torch.zeros(2, dtype=torch.float32 if r == 0 else torch.int32), name="mm_ag_dt",
                  contains="Mismatched data types")
    expect_raises(hvd.KoloInternalError, hvd.reducescatter, torch.zeros(4 + r), op=hvd.Sum,
                  name="mm_rs", contains=["Mismatched reducescatter tensor shapes",
                                          "'reducescatter.mm_rs'"])
    expect_raises(hvd.KoloInternalError, hvd.reducescatter, torch.zeros(4),
                  op=hvd.Sum if r == 0 else hvd.Average, name="mm_rs_op",
                  contains="Mismatched reduction operations")
    expect_raises(hvd.KoloInternalError, hvd.alltoall, torch.zeros(n, 1 + r), name="mm_a2a",
                  contains=["Mismatched alltoall tensor shapes", "'alltoall.mm_a2a'"])
    expect_raises(hvd.KoloInternalError, hvd.broadcast, torch.zeros(3 + r), 0, name="mm_bc",
                  contains=["Mismatched broadcast tensor shapes", "'broadcast.mm_bc'"])
    expect_raises(hvd.KoloInternalError, hvd.broadcast, torch.zeros(3), r % 2, name="mm_bc_root",
                  contains="Mismatched broadcast root ranks")
    h = hvd.grouped_allgather_async([torch.ones(1), torch.zeros(1, 1 + r)], name="mm_gag")
    expect_raises(hvd.KoloInternalError, hvd.synchronize, h, contains="Mismatched allgather")
    # ... and the job goes on.
    check(hvd.allgather(torch.full((1,), r), name="after").tolist() == list(range(n)), "after")
    out, recv = hvd.alltoall(torch.arange(n), splits=[1] * n, name="after_a2a")
    check(out.tolist() == [r] * n and recv.tolist() == [1] * n, "alltoall after errors")


def test_objects(r, n):
    """The helpers built on broadcast and allgather."""
    got = hvd.broadcast_object({"rank": r, "pad": "x" * (100 * r)}, root_rank=n - 1)
    check(got == {"rank": n - 1, "pad": "x" * (100 * (n - 1))}, "broadcast_object")
    objs = hvd.allgather_object([r] * r, name="objs")
    check(objs == [[q] * q for q in range(n)], "allgather_object %s" % objs)
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in lin.parameters():
            p.fill_(r)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    if r == 1:
        lin(torch.ones(1, 3)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=1)
    hvd.broadcast_parameters(lin.state_dict(), root_rank=1)
    check(opt.param_groups[0]["lr"] == 0.2 and len(opt.state) == 2, "optimizer state")
    bufs = hvd.allgather(torch.cat([opt.state[p]["momentum_buffer"].reshape(1, -1)
                                    for p in lin.parameters()], 1), name="momentum")
    check(all(torch.equal(bufs[0], bufs[q]) for q in range(n)), "momentum buffers differ")


def main():
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for test in [test_broadcast, test_allgather, test_alltoall, test_reducescatter,
                 test_mismatches, test_objects]:
        test(r, n)
        hvd.barrier()
        print("passed %s" % test.__name__, flush=True)
    # Every rank joins at about the same time: the last may be any rank, but
    # every rank must name the same one.
    last = hvd.join()
    assert 0 <= last < n, last
    assert hvd.allgather_object(last) == [last] * n
    hvd.shutdown()
    print("WORKER-OK rank %d" % r)


if __name__ == "__main__":
    sys.exit(main())
