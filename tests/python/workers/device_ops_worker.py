"""Run under kolorun (N >= 2) with one argument, the mode:

  cpu     CPU tensors (the reference behaviour)
  staged  CPU tensors forced through kolo.torch's CUDA staging code
          (_cuda.staged: host copies, the submission on a thread, results
          mapped back), with the copies to the host done by clone(): the
          staging plumbing, on machines without a GPU
  cuda    CUDA tensors on cuda:<local rank % device count>: allreduce,
          grouped_allreduce and broadcast on libkolo's device path (when the
          rank has a device arena), the rest staged through pinned memory

Every op of kolo.torch, in its sync, async, in-place, grouped and autograd
forms, on the global set and on a process set, fp16 compression,
DistributedOptimizer (backward_passes_per_step, Average and Sum),
broadcast_parameters, broadcast_optimizer_state, broadcast_object,
allgather_object, against references computed here from every rank's
(seeded) inputs; exact (small integers in every dtype). In cuda mode also:
the result of an op submitted on a non-default stream is visible on it, and
a tensor on another GPU (when there are two) is refused naming both.
Prints "passed <test>" per test and "WORKER-OK rank R <mode> <route>".
"""

import os
import sys

import torch

import kolo.torch as hvd
from kolo.torch import _cuda

MODE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
REDUCE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32,
                 torch.int64, torch.uint8]


def device():
    if MODE != "cuda":
        return torch.device("cpu")
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


def small(q, shape, dt, salt):
    """Rank q's tensor of small integers (exact sums over <= 8 ranks)."""
    g = torch.Generator().manual_seed(104729 * q + salt)
    lo = 0 if dt == torch.uint8 else -4
    return torch.randint(lo, 5, shape, dtype=torch.int64, generator=g).to(dt)


def on(t):
    return t.to(device())


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def same(got, want, what):
    check(got.device.type == device().type, "%s: result on %s, want %s" % (what, got.device,
                                                                          device()))
    g = got.detach().cpu()
    check(g.dtype == want.dtype and g.shape == want.shape and torch.equal(g, want),
          "%s: got %s, want %s" % (what, g.flatten()[:8].tolist(), want.flatten()[:8].tolist()))


def test_allreduce(r, n):
    for i, dt in enumerate(REDUCE_DTYPES):
        shape = (5, 3)
        ins = [small(q, shape, dt, i) for q in range(n)]
        total = sum(x.to(torch.int64) for x in ins).to(dt)
        same(hvd.allreduce(on(ins[r]), op=hvd.Sum, name="ar.%d" % i), total, "allreduce %s" % dt)
        mx = torch.stack(ins).max(0).values
        same(hvd.allreduce(on(ins[r]), op=hvd.Max, name="armax.%d" % i), mx, "max %s" % dt)
        t = on(ins[r])
        h = hvd.allreduce_async_(t, op=hvd.Sum, name="ar_.%d" % i)
        check(hvd.synchronize(h) is t, "in-place allreduce returns the tensor")
        same(t, total, "allreduce_ %s" % dt)
    f = [small(q, (64,), torch.float32, 99) for q in range(n)]
    avg = sum(f) / n
    same(hvd.allreduce(on(f[r]), name="avg"), avg, "average")
    same(hvd.allreduce(on(f[r]), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5,
                       name="scaled"), sum(f), "prescale/postscale")
    same(hvd.allreduce(on(f[r]), op=hvd.Sum, compression=hvd.Compression.fp16, name="fp16"),
         sum(f), "fp16 compression")
    # Not contiguous: staged through a contiguous copy, written back.
    base = on(torch.stack([f[r], f[r]], 1))
    view = base[:, 0]
    hvd.allreduce_(view, op=hvd.Sum, name="strided")
    same(base[:, 0].contiguous(), sum(f), "strided view")
    # Autograd: the gradient is allreduced the same way.
    x = on(f[r]).requires_grad_(True)
    y = hvd.allreduce(x, op=hvd.Sum, name="grad")
    y.sum().backward()
    same(x.grad, torch.full((64,), float(n)), "allreduce gradient")


def test_grouped_allreduce(r, n):
    ins = [[small(q, (7 + j,), torch.float32, 10 + j) for j in range(4)] for q in range(n)]
    want = [sum(ins[q][j] for q in range(n)) for j in range(4)]
    got = hvd.grouped_allreduce([on(t) for t in ins[r]], op=hvd.Sum, name="gar")
    for j in range(4):
        same(got[j], want[j], "grouped_allreduce member %d" % j)
    ts = [on(t) for t in ins[r]]
    got = hvd.synchronize(hvd.grouped_allreduce_async_(ts, op=hvd.Sum, name="gar_"))
    for j in range(4):
        check(got[j] is ts[j], "in-place grouped allreduce returns the tensors")
        same(ts[j], want[j], "grouped_allreduce_ member %d" % j)
    check(hvd.grouped_allreduce([], name="gar_empty") == [], "empty group")


def test_broadcast(r, n):
    for i, dt in enumerate(REDUCE_DTYPES + [torch.bool, torch.int16]):
        root = i % n
        want = small(root, (4, 3), dt, 30 + i) if dt != torch.bool else \
            small(root, (4, 3), torch.int64, 30 + i) > 0
        mine = small(r, (4, 3), dt, 30 + i) if dt != torch.bool else \
            small(r, (4, 3), torch.int64, 30 + i) > 0
        same(hvd.broadcast(on(mine), root, name="bc.%d" % i), want, "broadcast %s" % dt)
        t = on(mine)
        hvd.broadcast_(t, root, name="bc_.%d" % i)
        same(t, want, "broadcast_ %s" % dt)
    x = on(small(r, (3,), torch.float32, 40)).requires_grad_(True)
    hvd.broadcast(x, 0, name="bcgrad").sum().backward()
    same(x.grad, torch.full((3,), 1.0 if r == 0 else 0.0), "broadcast gradient")


def test_allgather(r, n):
    ins = [small(q, (q + 1, 2), torch.int32, 50) for q in range(n)]  # uneven first dims
    same(hvd.allgather(on(ins[r]), name="ag"), torch.cat(ins), "allgather")
    got = hvd.grouped_allgather([on(ins[r]), on(ins[r].double())], name="gag")
    same(got[0], torch.cat(ins), "grouped_allgather 0")
    same(got[1], torch.cat(ins).double(), "grouped_allgather 1")
    same(hvd.allgather(on(torch.empty(0, 2, dtype=torch.int32)), name="ag_empty"),
         torch.empty(0, 2, dtype=torch.int32), "allgather of nothing")


def test_alltoall(r, n):
    splits = [[(q + d) % 3 for d in range(n)] for q in range(n)]
    ins = [small(q, (sum(splits[q]), 2), torch.float32, 60) for q in range(n)]
    parts = []
    for q in range(n):
        off = sum(splits[q][:r])
        parts.append(ins[q][off:off + splits[q][r]])
    out, recv = hvd.alltoall(on(ins[r]), splits=splits[r], name="a2a")
    same(out, torch.cat(parts), "alltoall")
    check(recv.tolist() == [splits[q][r] for q in range(n)], "received splits %s" % recv)
    even = [small(q, (2 * n,), torch.int64, 61) for q in range(n)]
    same(hvd.alltoall(on(even[r]), name="a2a_even"),
         torch.cat([even[q][2 * r:2 * r + 2] for q in range(n)]), "even alltoall")


def test_reducescatter(r, n):
    rows = 2 * n + 1  # uneven: the first rows % n ranks get one more row
    ins = [small(q, (rows, 3), torch.float32, 70) for q in range(n)]
    total = sum(ins)
    lo = r * (rows // n) + min(r, rows % n)
    hi = lo + rows // n + (1 if r < rows % n else 0)
    same(hvd.reducescatter(on(ins[r]), op=hvd.Sum, name="rs"), total[lo:hi], "reducescatter")
    got = hvd.grouped_reducescatter([on(ins[r]), on(ins[r] * 2)], op=hvd.Sum, name="grs")
    same(got[0], total[lo:hi], "grouped_reducescatter 0")
    same(got[1], 2 * total[lo:hi], "grouped_reducescatter 1")


def test_process_set(r, n):
    evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    if r % 2 == 0:
        members = [q for q in range(n) if q % 2 == 0]
        ins = {q: small(q, (6,), torch.float32, 80) for q in members}
        same(hvd.allreduce(on(ins[r]), op=hvd.Sum, process_set=evens, name="ps_ar"),
             sum(ins.values()), "allreduce on a process set")
        same(hvd.allgather(on(ins[r]), process_set=evens, name="ps_ag"),
             torch.cat([ins[q] for q in members]), "allgather on a process set")
        same(hvd.broadcast(on(ins[r]), members[-1], process_set=evens, name="ps_bc"),
             ins[members[-1]], "broadcast on a process set")
    hvd.remove_process_set(evens)


def test_optimizer(r, n):
    for op, bpps in [(hvd.Average, 1), (hvd.Sum, 2)]:
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 3).to(device())
        opt = torch.optim.SGD(model.parameters(), lr=0.125, momentum=0.5)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=op,
                                        backward_passes_per_step=bpps)
        for step in range(3):
            dopt.zero_grad()
            for k in range(bpps):
                x = on(small(r, (8, 4), torch.float32, 90 + 10 * step + k))
                model(x).sum().backward()
            dopt.step()
        # Every rank ends with the same parameters.
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        allp = hvd.allgather(flat.reshape(1, -1), name="opt.check.%d" % op)
        check(all(torch.equal(allp[0].cpu(), allp[q].cpu()) for q in range(n)),
              "DistributedOptimizer (op %d, backward_passes_per_step %d): parameters differ"
              % (op, bpps))
        # broadcast_optimizer_state keeps the momentum buffers on the device.
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for st in opt.state.values():
            for v in st.values():
                if torch.is_tensor(v) and v.dim() > 0:
                    check(v.device.type == device().type, "optimizer state on %s" % v.device)


def test_objects(r, n):
    obj = hvd.broadcast_object({"rank": r, "t": torch.arange(3)}, root_rank=n - 1, name="obj")
    check(obj["rank"] == n - 1 and torch.equal(obj["t"], torch.arange(3)), "broadcast_object")
    check(hvd.allgather_object(r * 10, name="objs") == [q * 10 for q in range(n)],
          "allgather_object")
    hvd.barrier()


def test_cuda_streams(r, n):
    """The op's result is visible, without a host synchronisation, to later
    work on the (non-default) current stream it was submitted on."""
    s = torch.cuda.Stream(device())
    with torch.cuda.stream(s):
        x = torch.full((1 << 20,), float(r + 1), device=device())
        x = x * 1.0  # queued on s
        h = hvd.allreduce_async_(x, op=hvd.Sum, name="stream.ar")
        hvd.synchronize(h)
        y = x + 0  # ordered after the result on s
    s.synchronize()
    same(y, torch.full((1 << 20,), float(n * (n + 1) // 2)), "allreduce on a side stream")
    # Submitted on s, synchronized on the default stream: the default waits.
    with torch.cuda.stream(s):
        z = torch.full((1000,), 1.0, device=device()) * (r + 1)
        h = hvd.allreduce_async(z, op=hvd.Sum, name="stream.cross")
    out = hvd.synchronize(h) + 0  # on the default stream
    same(out, torch.full((1000,), float(n * (n + 1) // 2)), "result seen by another stream")
    if torch.cuda.device_count() > 1:
        other = (device().index + 1) % torch.cuda.device_count()
        try:
            hvd.allreduce(torch.ones(2, device="cuda:%d" % other), name="other.gpu")
        except ValueError as e:
            check("cuda:%d" % other in str(e) and "device arena" in str(e), str(e))
        else:
            raise AssertionError("a tensor on another GPU was accepted")


def fake_staging():
    """`staged` mode: CPU tensors take _cuda.staged with clone() for the
    copies to the host (no GPU needed)."""
    def route(tensors, op_name, device_capable=True):
        return _cuda.STAGED if tensors else _cuda.HOST

    _cuda.route = route
    _cuda.to_host = lambda tensors: ([t.detach().clone() for t in tensors], [])


def main():
    torch.set_num_threads(1)
    if MODE == "staged":
        fake_staging()
    # KOLO_DEVICE_ZERO_COPY=1: torch's allocator is swapped in init(), which
    # must come before torch initializes CUDA (set_device does).
    zero_copy = os.environ.get("KOLO_DEVICE_ZERO_COPY") == "1"
    if MODE == "cuda" and not zero_copy:
        torch.cuda.set_device(device())  # as a Horovod script does (after init is fine too)
    hvd.init()
    if MODE == "cuda" and zero_copy:
        torch.cuda.set_device(device())
    r, n = hvd.rank(), hvd.size()
    route = "host"
    if MODE == "cuda":
        arena, why = _cuda.arena_device()
        route = "device" if arena >= 0 else "staged (%s)" % why
        if zero_copy:
            from kolo.torch import _zero_copy
            route += " zero-copy" if _zero_copy.installed() else " (zero copy NOT installed)"
    tests = [test_allreduce, test_grouped_allreduce, test_broadcast, test_allgather,
             test_alltoall, test_reducescatter, test_process_set, test_optimizer, test_objects]
    if MODE == "cuda":
        tests.append(test_cuda_streams)
    for test in tests:
        test(r, n)
        hvd.barrier()
        print("passed %s" % test.__name__, flush=True)
    hvd.shutdown()
    print("WORKER-OK rank %d %s %s" % (r, MODE, route), flush=True)


if __name__ == "__main__":
    sys.exit(main())
