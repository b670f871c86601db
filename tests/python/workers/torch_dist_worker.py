"""torch.distributed on backend "kolo" (kolo.torch.distributed), run by
tests/python/test_torch_distributed.py through kolorun. argv[1] picks the
part: collectives | async_errors | ddp | cuda | fsdp DEVICE. Each check prints "passed <name>";
the last line is "WORKER-OK rank R". Every input is generated on every rank
from a per-rank seed, so each rank computes the references itself."""

import builtins
import warnings
import faulthandler
import functools
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import kolo.torch.distributed  # noqa: F401  (registers backend "kolo", init_method kolo://)

faulthandler.dump_traceback_later(150, exit=True)
print = functools.partial(builtins.print, flush=True)  # noqa: A001

warnings.filterwarnings("ignore", message=".*will be deprecated.*")
MODE = sys.argv[1]
TIMEOUT = (timedelta(seconds=float(sys.argv[2])) if len(sys.argv) > 2 and MODE != "fsdp"
           else timedelta(minutes=5))
dist.init_process_group(backend="kolo", init_method="kolo://", timeout=TIMEOUT)
R, N = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "kolo", dist.get_backend()

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int8, torch.uint8]


def data(rank, dtype, shape=(5, 3), lo=-20, hi=21, seed=0):
    """Rank `rank`'s input: small integers (every sum, min, max is exact in
    every dtype; products stay small)."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.uint8:
        lo = max(lo, 0)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def check(name, got, want):
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want), (name, len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want)):
            check("%s[%d]" % (name, i), g, w)
        return
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert torch.equal(got, want), "%s: got\n%s\nwant\n%s" % (name, got, want)


def passed(name):
    print("passed %s" % name)


def collectives():
    ops = {dist.ReduceOp.SUM: lambda xs: functools.reduce(torch.add, xs),
           dist.ReduceOp.MIN: lambda xs: functools.reduce(torch.minimum, xs),
           dist.ReduceOp.MAX: lambda xs: functools.reduce(torch.maximum, xs)}
    for dt in DTYPES:
        for op, ref in ops.items():
            t = data(R, dt)
            dist.all_reduce(t, op=op)
            check("allreduce %s %s" % (op, dt), t, ref([data(r, dt) for r in range(N)]))
        t = data(R, dt, lo=1, hi=3)
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        check("allreduce product %s" % dt, t,
              functools.reduce(torch.mul, [data(r, dt, lo=1, hi=3) for r in range(N)]))
    passed("allreduce")

    t = data(R, torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    want = sum(data(r, torch.float64) for r in range(N)) / N
    assert torch.allclose(t, want, rtol=1e-12, atol=0), (t, want)
    passed("allreduce_avg")

    # non-contiguous input and a 0-dim tensor
    t = data(R, torch.float32, shape=(4, 6)).t()
    dist.all_reduce(t)
    check("allreduce noncontig", t, sum(data(r, torch.float32, shape=(4, 6)) for r in range(N)).t())
    t = torch.tensor(float(R + 1))
    dist.all_reduce(t)
    assert t.item() == N * (N + 1) / 2
    passed("allreduce_shapes")

    for dt in (torch.float32, torch.int64):  # torch wants one dtype per call
        shapes = [(5, 3), (7,), (2, 2, 2)]
        ts = [data(R, dt, shape=sh, seed=i) for i, sh in enumerate(shapes)]
        dist.all_reduce_coalesced(ts)
        for i, (t, sh) in enumerate(zip(ts, shapes)):
            check("coalesced %d" % i, t, sum(data(r, dt, shape=sh, seed=i) for r in range(N)))
    passed("allreduce_coalesced")

    for dt in DTYPES:
        for root in range(N):
            t = data(R, dt, seed=root)
            dist.broadcast(t, root)
            check("broadcast %s root %d" % (dt, root), t, data(root, dt, seed=root))
    passed("broadcast")

    for dt in DTYPES:
        outs = [torch.empty((5, 3), dtype=dt) for _ in range(N)]
        dist.all_gather(outs, data(R, dt))
        for r in range(N):
            check("allgather %s from %d" % (dt, r), outs[r], data(r, dt))
        out = torch.empty((N * 5, 3), dtype=dt)
        dist.all_gather_into_tensor(out, data(R, dt))
        check("all_gather_into_tensor %s" % dt, out, torch.cat([data(r, dt) for r in range(N)]))
        objs = [None] * N
        dist.all_gather_object(objs, {"rank": R})
        assert objs == [{"rank": r} for r in range(N)], objs
    passed("allgather")

    for dt in DTYPES:
        full = [data(r, dt, shape=(N * 4, 2)) for r in range(N)]
        total = sum(full[1:], full[0]).to(dt)
        out = torch.empty((4, 2), dtype=dt)
        dist.reduce_scatter_tensor(out, full[R])
        check("reduce_scatter_tensor %s" % dt, out, total[R * 4:(R + 1) * 4])
        out = torch.empty((4, 2), dtype=dt)
        dist.reduce_scatter(out, list(full[R].chunk(N)))
        check("reduce_scatter %s" % dt, out, total[R * 4:(R + 1) * 4])
        for op, ref in [(dist.ReduceOp.MAX, torch.maximum), (dist.ReduceOp.MIN, torch.minimum)]:
            out = torch.empty((4, 2), dtype=dt)
            dist.reduce_scatter_tensor(out, full[R], op=op)
            check("reduce_scatter %s %s" % (op, dt), out,
                  functools.reduce(ref, full)[R * 4:(R + 1) * 4])
    passed("reduce_scatter")

    for dt in DTYPES:
        # all_to_all_single, even and uneven splits: rank r sends s+1 rows to rank s
        ins = [data(r, dt, shape=(N * 2, 3)) for r in range(N)]
        out = torch.empty((N * 2, 3), dtype=dt)
        dist.all_to_all_single(out, ins[R])
        check("all_to_all_single %s" % dt, out, torch.cat([ins[r][R * 2:(R + 1) * 2]
                                                           for r in range(N)]))
        sends = [s + 1 for s in range(N)]
        rows = sum(sends)
        ins = [data(r, dt, shape=(rows, 2), seed=7) for r in range(N)]
        out = torch.empty((N * (R + 1), 2), dtype=dt)
        dist.all_to_all_single(out, ins[R], output_split_sizes=[R + 1] * N,
                               input_split_sizes=sends)
        off = sum(sends[:R])
        check("all_to_all_single uneven %s" % dt, out,
              torch.cat([ins[r][off:off + R + 1] for r in range(N)]))
        outs = [torch.empty((r + 1, 3), dtype=dt) for r in range(N)]
        mine = [data(R, dt, shape=(R + 1, 3), seed=10 + d) for d in range(N)]
        dist.all_to_all(outs, mine)
        for r in range(N):
            check("all_to_all %s from %d" % (dt, r), outs[r], data(r, dt, shape=(r + 1, 3),
                                                                    seed=10 + R))
    passed("alltoall")

    dist.barrier()
    passed("barrier")

    # rooted ops built on the symmetric ones
    for root in range(N):
        t = data(R, torch.int64, seed=root)
        dist.reduce(t, root)
        want = sum(data(r, torch.int64, seed=root) for r in range(N)) if R == root else \
            data(R, torch.int64, seed=root)
        check("reduce root %d" % root, t, want)
        outs = [torch.empty((5, 3), dtype=torch.float32) for _ in range(N)] if R == root else None
        dist.gather(data(R, torch.float32, seed=root), outs, dst=root)
        if R == root:
            for r in range(N):
                check("gather %d" % r, outs[r], data(r, torch.float32, seed=root))
        out = torch.empty((5, 3), dtype=torch.float64)
        ins = [data(root, torch.float64, seed=20 + d) for d in range(N)] if R == root else None
        dist.scatter(out, ins, src=root)
        check("scatter root %d" % root, out, data(root, torch.float64, seed=20 + R))
        objs = [{"from": root}] if R == root else [None]
        dist.broadcast_object_list(objs, src=root)
        assert objs == [{"from": root}]
    passed("rooted")

    # dist.new_group -> a kolo process set (rank 1 is not a member at np >= 3)
    members = [r for r in range(N) if r != 1] if N >= 3 else [0, 1]
    g = dist.new_group(members)
    if R in members:
        gr = members.index(R)
        assert dist.get_rank(g) == gr and dist.get_world_size(g) == len(members)
        t = data(R, torch.int32, seed=3)
        dist.all_reduce(t, group=g)
        check("subgroup allreduce", t, sum(data(r, torch.int32, seed=3) for r in members).to(
            torch.int32))
        t = data(R, torch.int32, seed=4)
        dist.broadcast(t, src=members[-1], group=g)  # torch takes the global rank here
        check("subgroup broadcast", t, data(members[-1], torch.int32, seed=4))
        outs = [torch.empty((5, 3)) for _ in members]
        dist.all_gather(outs, data(R, torch.float32), group=g)
        for i, r in enumerate(members):
            check("subgroup allgather", outs[i], data(r, torch.float32))
        dist.barrier(group=g)
    t = torch.ones(2)
    dist.all_reduce(t)  # the default group still works beside it
    assert t.tolist() == [float(N)] * 2
    passed("new_group")


def async_errors():
    # async work: is_completed / wait / get_future, several in flight at once
    ts = [torch.full((1000,), float(R + i)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    for i, w in enumerate(works):
        w.wait()
        assert w.is_completed()
        assert torch.equal(ts[i], torch.full((1000,), float(sum(r + i for r in range(N)))))
        assert torch.equal(futs[i].wait()[0], ts[i])
    chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    assert torch.equal(chained.wait(), torch.full((3,), 2.0 * N))
    out = torch.empty(N * 2)
    w = dist.all_gather_into_tensor(out, torch.full((2,), float(R)), async_op=True)
    w.wait()
    assert out.tolist() == [float(r) for r in range(N) for _ in range(2)]
    passed("async")

    # a collective that fails in kolo: shapes differ between ranks
    t = torch.ones(3 + R)
    w = dist.all_reduce(t, async_op=True)
    try:
        w.wait()
        raise AssertionError("mismatched allreduce did not fail")
    except RuntimeError as e:
        msg = str(e)
        assert msg.startswith("kolo backend: allreduce (tensor ") and " failed: " in msg \
            and "shape" in msg.lower(), msg
        try:
            w.get_future().wait()
            raise AssertionError("the future of a failed allreduce completed")
        except RuntimeError as e2:
            assert "kolo backend: allreduce (tensor " in str(e2), str(e2)
        assert not w.is_success() and w.is_completed()
        print("mismatch error: %s" % msg.splitlines()[0][:300])
    passed("error_mismatch")

    for fn, text in [
        (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND),
         "not supported by the kolo backend"),
        (lambda: dist.send(torch.ones(1), (R + 1) % N), "send is not supported by the kolo"),
        (lambda: dist.recv(torch.ones(1), (R + 1) % N), "recv is not supported by the kolo"),
        (lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool)), "dtype"),
    ]:
        try:
            fn()
            raise AssertionError("no error, expected %r" % text)
        except RuntimeError as e:
            assert text in str(e), (text, str(e))
    passed("error_unsupported")

    # the default group still works after the errors
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [float(N)] * 4
    passed("after_errors")

    # torch's timeout: only rank 0 calls; its wait fails after the pg's timeout
    dist.barrier()
    if R == 0:
        import time
        t0 = time.monotonic()
        w = dist.all_reduce(torch.ones(2), async_op=True)
        try:
            w.wait()
            raise AssertionError("a collective only rank 0 called completed")
        except RuntimeError as e:
            took = time.monotonic() - t0
            assert "timed out" in str(e), str(e)
            assert took < TIMEOUT.total_seconds() + 10, took
            print("timeout error after %.1f s: %s" % (took, str(e).splitlines()[0][:300]))
    else:
        import time
        time.sleep(TIMEOUT.total_seconds() + 4)  # alive, but never calls the collective
    passed("timeout")


class Net(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.a = torch.nn.Linear(6, 16)
        self.b = torch.nn.Linear(16, 4)
        self.unused = torch.nn.Linear(16, 4) if unused else None

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _batches(steps, per_rank):
    g = torch.Generator().manual_seed(42)
    return [(torch.randn(N * per_rank, 6, generator=g), torch.randn(N * per_rank, 4, generator=g))
            for _ in range(steps)]


def _train(model, batches, per_rank, ddp=None, accumulate=1, rank_slice=True):
    net = ddp if ddp is not None else model
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for i in range(0, len(batches), accumulate):
        opt.zero_grad()
        group = batches[i:i + accumulate]
        for j, (x, y) in enumerate(group):
            if rank_slice:
                x, y = x[R * per_rank:(R + 1) * per_rank], y[R * per_rank:(R + 1) * per_rank]
            if ddp is not None and j < len(group) - 1:
                with ddp.no_sync():
                    torch.nn.functional.mse_loss(net(x), y).backward()
            else:
                torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return model


def _compare(name, dmodel, ref, tol):
    worst = max((p - q).abs().max().item() for p, q in zip(dmodel.parameters(),
                                                           ref.parameters()))
    assert worst <= tol, "%s: parameters differ by %g (tolerance %g)" % (name, worst, tol)
    print("%s max |param diff| %.3g" % (name, worst))


def ddp():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    per = 4
    cases = [("plain", {}, None, 1, 1e-6), ("no_sync", {}, None, 2, 1e-6),
             ("find_unused", {"find_unused_parameters": True}, None, 1, 1e-6),
             ("fp16_hook", {}, default_hooks.fp16_compress_hook, 1, 2e-3),
             ("bf16_hook", {}, default_hooks.bf16_compress_hook, 1, 2e-2),
             ("small_buckets", {"bucket_cap_mb": 0.0005}, None, 1, 1e-6)]
    for name, kw, hook, acc, tol in cases:
        unused = name == "find_unused"
        torch.manual_seed(0)
        model = Net(unused)
        # ranks start from different weights: DDP's initial broadcast must fix that
        if R != 0:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
        torch.manual_seed(0)
        ref = Net(unused)
        d = DDP(model, **kw)
        if hook is not None:
            d.register_comm_hook(None, hook)
        batches = _batches(6, per)
        _train(model, batches, per, ddp=d, accumulate=acc)
        _train(ref, batches, per, accumulate=acc, rank_slice=False)
        _compare(name, model, ref, tol)
        # every rank holds the same parameters
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        outs = [torch.empty_like(flat) for _ in range(N)]
        dist.all_gather(outs, flat)
        assert all(torch.equal(o, flat) for o in outs), name
        passed("ddp_%s" % name)


def cuda():
    """The collectives and DDP on CUDA tensors (torch's NCCL semantics):
    every op is issued on a side stream that first fills its inputs with a
    slow kernel, so a result read before the op waited for that stream, or
    a wait() that did not order the caller's stream, shows as wrong values."""
    import os
    dev = torch.device("cuda", int(os.environ.get("KOLO_LOCAL_RANK", "0"))
                       % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    side = torch.cuda.Stream(dev)

    def on_dev(t):
        big = torch.randn(2048, 2048, device=dev)
        for _ in range(4):  # about a millisecond of work ahead of the copy
            big = big @ big / 2048
        out = torch.empty_like(t, device=dev)
        out.copy_(t.to(dev, non_blocking=True) + big[0, 0] * 0)
        return out

    with torch.cuda.stream(side):
        for dt in [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]:
            t = on_dev(data(R, dt, shape=(1024, 3)))
            dist.all_reduce(t)
            check("cuda allreduce %s" % dt, t.cpu(),
                  functools.reduce(torch.add, [data(r, dt, shape=(1024, 3)) for r in range(N)]))
        passed("cuda_allreduce")

        t = on_dev(data(R, torch.float32, shape=(7, 5)))
        w = dist.all_reduce(t, async_op=True)
        w.wait()  # the side stream now waits for the op: later work sees the result
        twice = t * 2
        check("cuda async allreduce", twice.cpu(),
              2 * functools.reduce(torch.add, [data(r, torch.float32, shape=(7, 5))
                                               for r in range(N)]))
        passed("cuda_async")

        t = on_dev(data(R, torch.float32, shape=(9, 2)))
        dist.broadcast(t, src=N - 1)
        check("cuda broadcast", t.cpu(), data(N - 1, torch.float32, shape=(9, 2)))
        passed("cuda_broadcast")

        outs = [torch.empty(4, 3, device=dev) for _ in range(N)]
        dist.all_gather(outs, on_dev(data(R, torch.float32, shape=(4, 3))))
        for r in range(N):
            check("cuda allgather part %d" % r, outs[r].cpu(), data(r, torch.float32, shape=(4, 3)))
        out = torch.empty(N * 4, 3, device=dev)
        dist.all_gather_into_tensor(out, on_dev(data(R, torch.float32, shape=(4, 3))))
        check("cuda all_gather_into_tensor", out.cpu(),
              torch.cat([data(r, torch.float32, shape=(4, 3)) for r in range(N)]))
        passed("cuda_allgather")

        full = [data(r, torch.float32, shape=(N * 6,)) for r in range(N)]
        out = torch.empty(6, device=dev)
        dist.reduce_scatter_tensor(out, on_dev(full[R]))
        check("cuda reduce_scatter_tensor", out.cpu(),
              functools.reduce(torch.add, full)[R * 6:(R + 1) * 6])
        passed("cuda_reduce_scatter")

        inp = on_dev(data(R, torch.float32, shape=(N * 2, 3)))
        out = torch.empty(N * 2, 3, device=dev)
        dist.all_to_all_single(out, inp)
        want = torch.cat([data(r, torch.float32, shape=(N * 2, 3))[R * 2:(R + 1) * 2]
                          for r in range(N)])
        check("cuda all_to_all_single", out.cpu(), want)
        passed("cuda_alltoall")

    # DDP on CUDA against one process on the concatenated batch
    from torch.nn.parallel import DistributedDataParallel as DDP
    per = 4
    torch.manual_seed(0)
    model = Net().to(dev)
    if R != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    torch.manual_seed(0)
    ref = Net().to(dev)
    d = DDP(model, device_ids=[dev.index])
    batches = [(x.to(dev), y.to(dev)) for x, y in _batches(6, per)]
    _train(model, batches, per, ddp=d)
    _train(ref, batches, per, rank_slice=False)
    _compare("cuda_ddp", model, ref, 1e-5)
    passed("cuda_ddp")


def fsdp():
    """FSDP (torch.distributed.fsdp) on the kolo backend, each trained 6 SGD
    steps against one process on the concatenated batch, parameters within
    FSDP_TOL (float32 rounding of a different summation order):
    FullyShardedDataParallel with FULL_SHARD (parameters all-gathered with
    all_gather_into_tensor before each forward and backward, gradients
    reduce_scatter_tensor'ed into the shards) and SHARD_GRAD_OP (gathered
    once, kept through backward), from ranks that start with different
    weights (sync_module_states on CUDA; on CPU, which torch's
    sync_module_states refuses, a dist.broadcast of each parameter first); and FSDP2's fully_shard
    (DTensor parameters; its all-gather and reduce-scatter go through the
    process group's allgather_into_tensor_coalesced / reduce_scatter_tensor).
    argv[2]: cpu | cuda."""
    import os
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp import fully_shard
    where = sys.argv[2]
    if where == "cuda":
        dev = torch.device("cuda", int(os.environ.get("KOLO_LOCAL_RANK", "0"))
                           % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    per = 4
    batches = [(x.to(dev), y.to(dev)) for x, y in _batches(6, per)]

    def start(shift):
        torch.manual_seed(0)
        m = Net().to(dev)
        if shift and R != 0:
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(1.0)
        return m

    ref = _train(start(False), batches, per, rank_slice=False)
    for label, strategy in (("full_shard", ShardingStrategy.FULL_SHARD),
                            ("shard_grad_op", ShardingStrategy.SHARD_GRAD_OP)):
        # device_id=cpu: torch 2.x's FSDP takes CPU modules when told so
        m = start(True)
        if where == "cpu":  # torch's sync_module_states refuses CPU modules: broadcast here
            for p in m.parameters():
                dist.broadcast(p.data, 0)
        model = FSDP(m, sync_module_states=where != "cpu", device_id=dev,
                     sharding_strategy=strategy, use_orig_params=True)
        _train(model, batches, per, ddp=None)
        with FSDP.summon_full_params(model):
            _compare("fsdp_%s_%s" % (label, where), model.module, ref, FSDP_TOL)
            flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
        outs = [torch.empty_like(flat) for _ in range(N)]
        dist.all_gather(outs, flat)
        assert all(torch.equal(o, flat) for o in outs), "fsdp %s: ranks disagree" % label
        passed("fsdp_%s_%s" % (label, where))

    m = start(False)  # FSDP2 does not broadcast rank 0's weights: start equal
    for layer in (m.a, m.b):
        fully_shard(layer)
    fully_shard(m)
    from torch.distributed.tensor import DTensor
    assert all(isinstance(p, DTensor) for p in m.parameters()), "fully_shard: not DTensors"
    _train(m, batches, per)
    full = [p.full_tensor() for p in m.parameters()]
    worst = max((p - q).abs().max().item() for p, q in zip(full, ref.parameters()))
    assert worst <= FSDP_TOL, "fsdp2_%s: parameters differ by %g" % (where, worst)
    print("fsdp2_%s max |param diff| %.3g" % (where, worst))
    passed("fsdp2_%s" % where)


FSDP_TOL = 1e-5


def functional():
    """torch 2.x's functional collectives, the process group's coalesced
    and base forms called directly (as FSDP2 and C++ callers do), DTensor
    redistribution, and an error that names the tensor; bit-exact
    (integer-valued floats)."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    g = dist.group.WORLD
    pg = dist.distributed_c10d._get_default_group()
    assert pg.getBackendName() == "kolo", pg.getBackendName()
    x = [torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r for r in range(N)]
    mine = x[R]
    total = sum(x)
    cat = torch.cat(x)

    check("f_all_reduce", funcol.all_reduce(mine, "sum", g).wait(), total)
    check("f_all_reduce_avg", funcol.all_reduce(mine, "avg", g).wait(), total / N)
    check("f_all_gather", funcol.all_gather_tensor(mine, 0, g).wait(), cat)
    big = torch.cat([xi * (k + 1) for k, xi in enumerate([mine] * N)])  # N blocks of 2 rows
    want_rs = sum(xi for xi in x) * (R + 1)
    check("f_reduce_scatter", funcol.reduce_scatter_tensor(big, "sum", 0, g).wait(), want_rs)
    a, b = mine.clone(), mine[0].clone()
    got = funcol.all_reduce_coalesced([a, b], "sum", g)
    check("f_all_reduce_coalesced", [t.wait() for t in got], [total, total[0]])
    got = funcol.all_gather_into_tensor_coalesced([mine, mine[1]], g)
    check("f_all_gather_coalesced", [t.wait() for t in got],
          [cat, torch.cat([xi[1] for xi in x])])
    got = funcol.reduce_scatter_tensor_coalesced([big, big.reshape(-1)], "sum", [0, 0], g)
    check("f_reduce_scatter_coalesced", [t.wait() for t in got],
          [want_rs, want_rs.reshape(-1)])
    rows = torch.stack([torch.full((3,), float(100 * R + d)) for d in range(N)])
    check("f_all_to_all_single", funcol.all_to_all_single(rows, None, None, g).wait(),
          torch.stack([torch.full((3,), float(100 * s + R)) for s in range(N)]))
    check("f_broadcast", funcol.broadcast(mine, 0, g).wait(), x[0])
    # kolo's kernels for the two functional ops serve every group: a gloo one too
    gl = dist.new_group(backend="gloo")
    check("f_gloo_all_gather", funcol.all_gather_tensor(mine, 0, gl).wait(), cat)
    check("f_gloo_reduce_scatter", funcol.reduce_scatter_tensor(big, "sum", 0, gl).wait(),
          want_rs)
    passed("functional")

    # the group's own methods, as C++ callers reach them (future-wrapping Work)
    o1, o2 = torch.empty(2 * N, 3), torch.empty(3 * N)
    w = pg.allgather_into_tensor_coalesced([o1, o2], [mine, mine[0].clone()])
    w.get_future().wait()
    check("pg_allgather_into_tensor_coalesced", [o1, o2],
          [cat, torch.cat([xi[0] for xi in x])])
    r1, r2 = torch.empty(2, 3), torch.empty(3)
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    w = pg.reduce_scatter_tensor_coalesced([r1, r2], [big, torch.cat([mine[0]] * N)], opts)
    w.get_future().wait()
    check("pg_reduce_scatter_tensor_coalesced", [r1, r2], [want_rs, total[0]])
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    w = pg.reduce_scatter_tensor_coalesced([r2], [torch.cat([mine[0]] * N)], opts)
    w.get_future().wait()
    check("pg_reduce_scatter_tensor_coalesced_max", r2, x[N - 1][0])
    a, b = mine.clone(), mine[1].clone()
    w = pg.allreduce_coalesced([a, b], dist.AllreduceCoalescedOptions())
    w.get_future().wait()
    check("pg_allreduce_coalesced", [a, b], [total, total[1]])
    out = torch.empty(2 * N, 3)
    pg._allgather_base(out, mine).get_future().wait()
    check("pg_allgather_base", out, cat)
    rs = torch.empty(2, 3)
    pg._reduce_scatter_base(rs, big).get_future().wait()
    check("pg_reduce_scatter_base", rs, want_rs)
    w = pg.allreduce([mine.clone()])
    assert isinstance(w, dist.Work) and torch.equal(w.get_future().wait()[0], total)
    passed("pg_methods")

    # DTensor on a mesh of the kolo group: shard, then replicate
    mesh = init_device_mesh("cpu", (N,))
    full = torch.arange(4.0 * N * 3).reshape(4 * N, 3)
    d = distribute_tensor(full, mesh, [Shard(0)])
    assert isinstance(d, DTensor) and d.to_local().shape == (4, 3), d.to_local().shape
    check("dtensor_full_tensor", d.full_tensor(), full)
    check("dtensor_replicate", d.redistribute(mesh, [Replicate()]).to_local(), full)
    passed("dtensor")

    # errors name the tensor
    w = dist.all_reduce(torch.ones(3 + R), async_op=True)
    try:
        w.wait()
        raise AssertionError("mismatched allreduce did not fail")
    except RuntimeError as e:
        msg = str(e)
        assert "tensor float32[%d]" % (3 + R) in msg and "kolo name tdist." in msg, msg
        print("named error: %s" % msg.splitlines()[0][:300])
    passed("error_names_tensor")


{"collectives": collectives, "async_errors": async_errors, "ddp": ddp,
 "cuda": cuda, "fsdp": fsdp, "functional": functional}[MODE]()
dist.destroy_process_group()
print("WORKER-OK rank %d" % R)
