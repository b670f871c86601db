"""Run under kolorun (N >= 2): process sets in kolo.torch. Two static sets,
the even and the odd ranks (registered by init(process_sets=[...])), are
used at once -- every rank runs every op on its own set, often under the
same names as the other set and as the global set -- and every result is
checked bit for bit against a reference this script computes from the
members' inputs (inputs are seeded by global rank, so any rank can rebuild
any rank's tensor). Then: grouped (atomic) ops on sets and on the global
set, a DistributedOptimizer training within each set, the errors (a rank
outside the set, a broadcast root outside it, disagreeing / duplicate /
refused adds, mismatches inside a set) with their messages, and
add/remove_process_set at run time. Prints "passed test_X" per test and
"WORKER-OK rank R" at the end; a failed check raises.
"""

import os
import sys

import torch

import kolo.torch as hvd

KOLO_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
               torch.uint8, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def small(q, shape, dt, salt):
    """Rank q's tensor of small integers (in dt): sums, minima and maxima
    over a few ranks are exact in every dtype, whatever the order."""
    g = torch.Generator().manual_seed(104729 * q + salt)
    lo = 0 if dt == torch.uint8 else -8
    return torch.randint(lo, 9, shape, dtype=torch.int64, generator=g).to(dt)


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


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


class World:
    """This rank's view: its set (`mine`, even or odd ranks), the other set,
    and its rank / the size within its set."""

    def __init__(self, even, odd):
        self.r, self.n = hvd.rank(), hvd.size()
        self.even, self.odd = even, odd
        self.mine, self.other = (even, odd) if self.r % 2 == 0 else (odd, even)
        self.members = [q for q in range(self.n) if q % 2 == self.r % 2]
        self.sr, self.sn = self.members.index(self.r), len(self.members)


def reduce_ref(tensors, op):
    """Reference reduction, exact for the small integers of small()."""
    wide = torch.stack([t.to(torch.float64) for t in tensors])
    if op == hvd.Sum:
        out = wide.sum(0)
    elif op == hvd.Min:
        out = wide.min(0).values
    elif op == hvd.Max:
        out = wide.max(0).values
    elif op == hvd.Product:
        out = wide.prod(0)
    else:
        out = wide.sum(0) / len(tensors)
    return out.to(tensors[0].dtype)


# --------------------------------------------------------------------------


def test_registration(w):
    ids = (w.even.process_set_id, w.odd.process_set_id)
    check(ids[0] is not None and ids[1] is not None and 0 < ids[0] < ids[1], "ids %s" % (ids,))
    check(hvd.allgather_object(ids, name="ps_ids") == [ids] * w.n, "every rank has the same ids")
    check(w.mine.ranks == w.members and w.other.ranks == [q for q in range(w.n)
                                                          if q not in w.members], "ranks")
    check(w.mine.size() == w.sn and w.mine.rank() == w.sr and w.mine.included() is True,
          "size/rank/included of my set: %s %s %s" % (w.mine.size(), w.mine.rank(),
                                                      w.mine.included()))
    check(w.other.size() == w.n - w.sn and w.other.rank() == -1 and w.other.included() is False,
          "the other set")
    check(hvd.global_process_set.included() and hvd.global_process_set.size() == w.n, "global")
    check(w.mine == w.mine and w.mine != w.other and w.mine != hvd.global_process_set, "__eq__")
    check("process_set_id=%d" % w.mine.process_set_id in repr(w.mine), repr(w.mine))


def test_allreduce(w):
    for i, dt in enumerate(KOLO_DTYPES):
        ins = {q: small(q, (3, 4), dt, i) for q in range(w.n)}
        mine_in = [ins[q] for q in w.members]
        ops = [hvd.Sum, hvd.Min, hvd.Max] + ([hvd.Average] if dt in FLOATS else [])
        for op in ops:
            # The same name on both sets (names are per set).
            got = hvd.allreduce(ins[w.r], op=op, name="ar.%s.%d" % (dt, op), process_set=w.mine)
            check(same_bits(got, reduce_ref(mine_in, op)), "allreduce %s op %d: %s" % (dt, op, got))
        t = ins[w.r].clone()
        check(hvd.allreduce_(t, op=hvd.Sum, name="ar_.%s" % dt, process_set=w.mine) is t and
              same_bits(t, reduce_ref(mine_in, hvd.Sum)), "allreduce_ %s" % dt)
    # Product on values in [-2, 2] (exact in int8 over two ranks too).
    x = small(w.r, (6,), torch.int32, 50) % 5 - 2
    got = hvd.allreduce(x, op=hvd.Product, name="prod", process_set=w.mine)
    check(torch.equal(got, reduce_ref([small(q, (6,), torch.int32, 50) % 5 - 2
                                       for q in w.members], hvd.Product)), "product")
    # On the set and on the global set at once, under the same name.
    x = small(w.r, (5,), torch.float32, 60)
    h_set = hvd.allreduce_async(x, op=hvd.Sum, name="both", process_set=w.mine)
    h_all = hvd.allreduce_async(x, op=hvd.Sum, name="both")
    check(same_bits(hvd.synchronize(h_all), reduce_ref([small(q, (5,), torch.float32, 60)
                                                        for q in range(w.n)], hvd.Sum)),
          "global allreduce beside the set's")
    check(same_bits(hvd.synchronize(h_set), reduce_ref([small(q, (5,), torch.float32, 60)
                                                        for q in w.members], hvd.Sum)),
          "set allreduce beside the global one")
    # Average divides by the set's size; scale factors; fp16 compression.
    got = hvd.allreduce(torch.full((4,), float(w.sr + 1), dtype=torch.float64), name="avg",
                        process_set=w.mine)
    check(torch.equal(got, torch.full((4,), (w.sn + 1) / 2.0, dtype=torch.float64)),
          "Average over the set: %s" % got)
    got = hvd.allreduce(x.double(), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25,
                        name="scaled", process_set=w.mine)
    check(torch.equal(got, reduce_ref([small(q, (5,), torch.float64, 60) for q in w.members],
                                      hvd.Sum) * 0.5), "scale factors")
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16, name="fp16",
                        process_set=w.mine)
    check(got.dtype == torch.float32 and torch.equal(got, reduce_ref(
        [small(q, (5,), torch.float32, 60) for q in w.members], hvd.Sum)), "fp16 compression")
    # Unnamed ops count per set: a different number of them on each set
    # does not shift the names of later unnamed global ops.
    for _ in range(1 + w.r % 2):
        hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=w.mine)
    check(hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == w.n, "unnamed global after sets")
    # Autograd: the gradient is allreduced over the set too.
    v = torch.ones(3, requires_grad=True)
    hvd.allreduce(v, op=hvd.Sum, name="ar_grad", process_set=w.mine).sum().backward()
    check(torch.equal(v.grad, torch.full((3,), float(w.sn))), "allreduce grad %s" % v.grad)
    # Sparse allreduce on the set.
    sp = torch.sparse_coo_tensor(torch.tensor([[w.r]]), torch.tensor([2.0]), (w.n,))
    got = hvd.synchronize(hvd.sparse_allreduce_async(sp, name="sparse", op=hvd.Average,
                                                     process_set=w.mine)).to_dense()
    want = torch.zeros(w.n)
    want[w.members] = 2.0 / w.sn
    check(torch.equal(got, want), "sparse allreduce %s" % got)


def test_broadcast(w):
    root = w.members[-1]  # a global rank
    for i, dt in enumerate(KOLO_DTYPES + [torch.bool, torch.int16]):
        mine = small(w.r, (2, 3), dt, 70 + i) if dt != torch.bool else \
            (small(w.r, (2, 3), torch.int8, 70 + i) > 0)
        want = small(root, (2, 3), dt, 70 + i) if dt != torch.bool else \
            (small(root, (2, 3), torch.int8, 70 + i) > 0)
        got = hvd.broadcast(mine, root, name="bc.%s" % dt, process_set=w.mine)
        check(same_bits(got, want), "broadcast %s from %d" % (dt, root))
        t = mine.clone()
        check(hvd.broadcast_(t, root, name="bc_.%s" % dt, process_set=w.mine) is t and
              same_bits(t, want), "broadcast_ %s" % dt)
    got = hvd.broadcast_object({"from": w.r, "pad": "y" * w.r}, root_rank=root, name="bo",
                               process_set=w.mine)
    check(got == {"from": root, "pad": "y" * root}, "broadcast_object %s" % got)
    check(hvd.allgather_object(("r", w.r), name="ao", process_set=w.mine) ==
          [("r", q) for q in w.members], "allgather_object")
    torch.manual_seed(w.r)
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1 * (w.r + 1), momentum=0.9)
    hvd.broadcast_parameters(lin.state_dict(), root_rank=root, process_set=w.mine)
    hvd.broadcast_optimizer_state(opt, root_rank=root, process_set=w.mine)
    torch.manual_seed(root)
    ref = torch.nn.Linear(3, 2)
    check(all(torch.equal(a, b) for a, b in zip(lin.state_dict().values(),
                                                ref.state_dict().values())),
          "broadcast_parameters on the set")
    check(opt.param_groups[0]["lr"] == 0.1 * (root + 1), "broadcast_optimizer_state")
    # Autograd: the root gets the set's average gradient, the others zero.
    v = torch.ones(2, requires_grad=True)
    hvd.broadcast(v, root, name="bc_grad", process_set=w.mine).sum().backward()
    check(torch.equal(v.grad, torch.full((2,), 1.0 if w.r == root else 0.0)),
          "broadcast grad %s" % v.grad)


def test_allgather(w):
    for i, dt in enumerate(KOLO_DTYPES + [torch.int16]):
        # Set rank 0 sends no rows: dim 0 is the set rank.
        rows = lambda q: w.members.index(q)  # noqa: E731
        ins = {q: small(q, (rows(q), 2), dt, 90 + i) for q in w.members}
        got = hvd.allgather(ins[w.r], name="ag.%s" % dt, process_set=w.mine)
        check(same_bits(got, torch.cat([ins[q] for q in w.members])), "allgather %s" % dt)
    h = hvd.allgather_async(torch.full((1,), w.r), name="ag_async", process_set=w.mine)
    check(hvd.synchronize(h).tolist() == w.members, "allgather_async")
    # Autograd: the averaged gradient of this rank's rows.
    v = torch.ones(w.r + 1, 2, requires_grad=True)
    y = hvd.allgather(v, name="ag_grad", process_set=w.mine)
    weights = torch.arange(y.shape[0], dtype=torch.float32).unsqueeze(1).expand(-1, 2)
    (y * weights).sum().backward()
    off = sum(q + 1 for q in w.members[:w.sr])
    check(torch.equal(v.grad, weights[off:off + w.r + 1]), "allgather grad %s" % v.grad)


def test_alltoall(w):
    def splits_of(q):
        s = w.members.index(q)
        return [(s + d) % 3 for d in range(w.sn)]

    def rows_of(q, dt):
        n_rows = sum(splits_of(q)) + 1  # the last row is not sent
        return (torch.arange(n_rows * 2, dtype=torch.int64).reshape(n_rows, 2) + 1000 * q).to(dt)

    for dt in [torch.float32, torch.int64, torch.bfloat16]:
        out, recv = hvd.alltoall(rows_of(w.r, dt), splits=splits_of(w.r), name="a2a.%s" % dt,
                                 process_set=w.mine)
        want, want_recv = [], []
        for q in w.members:
            sp = splits_of(q)
            off = sum(sp[:w.sr])
            want.append(rows_of(q, dt)[off:off + sp[w.sr]])
            want_recv.append(sp[w.sr])
        check(same_bits(out, torch.cat(want)), "alltoall %s: %s" % (dt, out))
        check(recv.dtype == torch.int32 and recv.tolist() == want_recv, "received splits %s" % recv)
    # Even split (no splits: the output only), over the set's size.
    out = hvd.alltoall(torch.arange(2 * w.sn) + 100 * w.r, name="a2a_even", process_set=w.mine)
    check(out.tolist() == [v for q in w.members for v in (100 * q + 2 * w.sr,
                                                          100 * q + 2 * w.sr + 1)],
          "even alltoall %s" % out)
    # Autograd: the rows sent get the gradient back, the unsent row none.
    v = rows_of(w.r, torch.float32).requires_grad_()
    out, _ = hvd.alltoall(v, splits=splits_of(w.r), name="a2a_grad", process_set=w.mine)
    (out * 2).sum().backward()
    want = torch.full(v.shape, 2.0)
    want[-1] = 0
    check(torch.equal(v.grad, want), "alltoall grad %s" % v.grad)


def test_reducescatter(w):
    dim0 = 2 * w.sn + 1  # uneven: set rank 0 gets one more row
    base = dim0 // w.sn
    start = w.sr * base + min(w.sr, dim0 % w.sn)
    rows = base + (1 if w.sr < dim0 % w.sn else 0)
    for i, dt in enumerate(KOLO_DTYPES):
        ins = [small(q, (dim0, 2), dt, 110 + i) for q in w.members]
        ops = [hvd.Sum] + ([hvd.Average] if dt in FLOATS else [])
        for op in ops:
            got = hvd.reducescatter(ins[w.sr], op=op, name="rs.%s.%d" % (dt, op),
                                    process_set=w.mine)
            check(same_bits(got, reduce_ref(ins, op)[start:start + rows]),
                  "reducescatter %s op %d: %s" % (dt, op, got))
    x = small(w.r, (dim0, 3), torch.float64, 130)
    got = hvd.synchronize(hvd.reducescatter_async(x, name="rs_scaled", op=hvd.Sum,
                                                  process_set=w.mine, prescale_factor=2.0,
                                                  postscale_factor=0.5))
    check(torch.equal(got, reduce_ref([small(q, (dim0, 3), torch.float64, 130)
                                       for q in w.members], hvd.Sum)[start:start + rows]),
          "reducescatter scale factors")
    v = torch.ones(dim0, 2, requires_grad=True)
    hvd.reducescatter(v, op=hvd.Average, name="rs_grad", process_set=w.mine).sum().backward()
    check(torch.equal(v.grad, torch.full((dim0, 2), 1.0)), "reducescatter grad %s" % v.grad)


def test_grouped(w):
    """Grouped (atomic) allreduce, allgather and reducescatter, each on this
    rank's set and on the global set at once, under the same names."""
    for ps, ranks, tag in [(w.mine, w.members, "set"), (hvd.global_process_set,
                                                       list(range(w.n)), "global")]:
        k, me = len(ranks), ranks.index(w.r)
        shapes = [((3,), torch.float32), ((2, 2), torch.int32), ((0,), torch.float64),
                  ((4, 1), torch.bfloat16)]
        ins = {q: [small(q, s, dt, 150 + j) for j, (s, dt) in enumerate(shapes)] for q in ranks}
        refs = [reduce_ref([ins[q][j] for q in ranks], hvd.Sum) for j in range(len(shapes))]
        outs = hvd.grouped_allreduce(ins[w.r], op=hvd.Sum, name="g", process_set=ps)
        check(len(outs) == len(shapes) and all(same_bits(o, e) for o, e in zip(outs, refs)),
              "grouped_allreduce %s" % tag)
        ts = [t.clone() for t in ins[w.r]]
        h = hvd.grouped_allreduce_async_(ts, op=hvd.Sum, process_set=ps)
        res = hvd.synchronize(h)
        check(all(a is b for a, b in zip(res, ts)) and
              all(same_bits(o, e) for o, e in zip(ts, refs)), "grouped_allreduce_async_ %s" % tag)
        fl = [small(w.r, (5,), torch.float32, 170), small(w.r, (2,), torch.float64, 171)]
        outs = hvd.grouped_allreduce(fl, op=hvd.Average, compression=hvd.Compression.fp16,
                                     name="g16", process_set=ps)
        want = [reduce_ref([small(q, (5,), torch.float32, 170) for q in ranks], hvd.Sum) / k,
                reduce_ref([small(q, (2,), torch.float64, 171) for q in ranks], hvd.Sum) / k]
        check([o.dtype for o in outs] == [torch.float32, torch.float64] and
              all(torch.allclose(o, e, atol=1e-2) for o, e in zip(outs, want)),
              "grouped_allreduce fp16 %s: %s vs %s" % (tag, outs, want))
        # allgather: dim 0 differs per rank (rank 0 of the set: none).
        ag = {q: [small(q, (ranks.index(q), 3), torch.int64, 180),
                  small(q, (1,), torch.float16, 181)] for q in ranks}
        outs = hvd.grouped_allgather(ag[w.r], name="gag", process_set=ps)
        check(all(same_bits(outs[j], torch.cat([ag[q][j] for q in ranks])) for j in range(2)),
              "grouped_allgather %s" % tag)
        h = hvd.grouped_allgather_async([torch.full((1,), w.r)], process_set=ps)
        check(hvd.synchronize(h)[0].tolist() == ranks, "grouped_allgather_async %s" % tag)
        # reducescatter: uneven first dimensions.
        rs = {q: [small(q, (k + 1, 2), torch.float32, 190), small(q, (2 * k, ), torch.int32, 191)]
              for q in ranks}
        for op in (hvd.Sum, hvd.Average):
            outs = hvd.grouped_reducescatter(rs[w.r], op=op, name="grs.%d" % op, process_set=ps)
            for j, o in enumerate(outs):
                full = reduce_ref([rs[q][j] for q in ranks], hvd.Sum)
                if op == hvd.Average:
                    full = full / k if full.is_floating_point() else full
                d0 = full.shape[0]
                start = me * (d0 // k) + min(me, d0 % k)
                rows = d0 // k + (1 if me < d0 % k else 0)
                if op == hvd.Average and not full.is_floating_point():
                    continue  # integer Average: checked by the C tests
                check(same_bits(o, full[start:start + rows]),
                      "grouped_reducescatter %s op %d member %d: %s" % (tag, op, j, o))
        check(hvd.grouped_allreduce([], process_set=ps) == [] and
              hvd.grouped_allgather([], process_set=ps) == [] and
              hvd.grouped_reducescatter([], process_set=ps) == [], "empty groups")
    # A group is one unit: a rank listing other members fails the whole group.
    mine = [torch.ones(2), torch.ones(2)] if w.r == 0 else [torch.ones(2)]
    expect_raises(hvd.KoloInternalError, hvd.grouped_allreduce, mine, name="mm_group",
                  contains="Mismatched group membership")


def test_barrier(w):
    for _ in range(2):
        hvd.barrier(process_set=w.mine)
    hvd.barrier()


def test_independent(w):
    """A set's collectives never wait for ranks outside it: the even ranks
    finish ops on their set before they open a global "gate" that the odd
    ranks wait on before running theirs (this deadlocks if a set's op needs
    the other ranks)."""
    def on_my_set(k):
        got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="indep.%d" % k, process_set=w.mine)
        hvd.barrier(process_set=w.mine)
        check(torch.equal(got, torch.full((2,), float(w.sn))), "independent set op")

    for k in range(2):
        if w.r % 2 == 0:
            on_my_set(k)
        gate = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="gate.%d" % k)
        check(gate.item() == w.n, "gate")
        if w.r % 2 == 1:
            on_my_set(k)


def _train(w, dist_kwargs, tag):
    """Trains a small model within this rank's set: every member starts
    from the set root's weights and learns from its own data. Returns the
    flat parameters and the reference (a single process averaging the
    members' gradients itself)."""
    root = w.members[0]

    def model(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))

    def batch(q, step):
        g = torch.Generator().manual_seed(1000 * q + step)
        return torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)

    def flat(m):
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()])

    net = model(w.r)
    hvd.broadcast_parameters(net.state_dict(), root_rank=root, process_set=w.mine)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.5),
                                   named_parameters=net.named_parameters(),
                                   process_set=w.mine, **dist_kwargs)
    for step in range(3):
        x, y = batch(w.r, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()

    ref = model(root)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5)
    for step in range(3):
        grads = []
        for q in w.members:
            ref.zero_grad()
            x, y = batch(q, step)
            torch.nn.functional.mse_loss(ref(x), y).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for j, p in enumerate(ref.parameters()):
            p.grad = sum(g[j] for g in grads) / w.sn
        ref_opt.step()
    return flat(net), flat(ref)


def test_optimizer(w):
    for tag, kw in [("plain", {}), ("groups", {"groups": 2})]:
        params, ref = _train(w, kw, tag)
        every = hvd.allgather(params.unsqueeze(0), name="params.%s" % tag, process_set=w.mine)
        check(all(same_bits(every[0], every[i]) for i in range(w.sn)),
              "%s: parameters differ inside the set" % tag)
        err = (params - ref).abs().max().item()
        check(err <= 1e-5, "%s: max |distributed - reference| = %g" % (tag, err))
        sets = hvd.allgather(params.unsqueeze(0), name="params_all.%s" % tag)
        check(not torch.equal(sets[0], sets[1]), "%s: the two sets trained alike" % tag)


def test_errors(w):
    other_id = w.other.process_set_id
    not_in = ["rank %d is not in process set %d" % (w.r, other_id), str(w.other.ranks)]
    x = torch.ones(2)
    for fn, args in [(hvd.allreduce, (x,)), (hvd.allreduce_async_, (x,)),
                     (hvd.grouped_allreduce, ([x],)), (hvd.allgather, (x,)),
                     (hvd.grouped_allgather, ([x],)), (hvd.broadcast, (x, w.other.ranks[0])),
                     (hvd.alltoall, (x,)), (hvd.reducescatter, (x,)),
                     (hvd.grouped_reducescatter, ([x],)), (hvd.allgather_object, (1,)),
                     (hvd.broadcast_object, (1, w.other.ranks[0]))]:
        expect_raises(ValueError, fn, *args, process_set=w.other, contains=not_in)
    expect_raises(ValueError, hvd.barrier, process_set=w.other, contains=not_in)
    # A DistributedOptimizer on a set without this rank communicates nothing
    # (Horovod): step() is the plain optimizer's.
    lin = torch.nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.fill_(0.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=1),
                                   named_parameters=lin.named_parameters(), process_set=w.other)
    lin(torch.full((1, 2), float(w.r + 1))).sum().backward()
    opt.step()
    check(torch.equal(lin.weight.detach(), torch.full((1, 2), -float(w.r))), "local step outside set")
    # A broadcast root outside the set (a global rank of the other set).
    outside = w.other.ranks[0]
    msg = "broadcast root rank %d is not in process set %d" % (outside, w.mine.process_set_id)
    expect_raises(ValueError, hvd.broadcast, x, outside, process_set=w.mine, contains=msg)
    expect_raises(ValueError, hvd.broadcast_parameters, lin.state_dict(), outside,
                  process_set=w.mine, contains=msg)
    # alltoall's splits have one entry per member of the set.
    expect_raises(ValueError, hvd.alltoall, torch.ones(w.n + 1), splits=[1] * (w.n + 1),
                  process_set=w.mine, contains="one per rank")
    # Mismatches inside a set fail on its members with the agent's message.
    if w.sn >= 2:
        expect_raises(hvd.KoloInternalError, hvd.allreduce, torch.ones(2 + w.sr), name="mm",
                      process_set=w.mine, contains=["Mismatched", "allreduce.mm"])
    # Collective adds refused on every rank with libkolo's message.
    expect_raises(ValueError, hvd.add_process_set, [0, 0], contains="rank 0 is listed twice")
    expect_raises(ValueError, hvd.add_process_set, [0, w.n], contains="is not a rank of this job")
    expect_raises(ValueError, hvd.add_process_set, w.even.ranks,
                  contains="already exist as process set %d" % w.even.process_set_id)
    expect_raises(ValueError, hvd.add_process_set, list(range(w.n)),
                  contains="that is the global process set (0)")
    expect_raises(ValueError, hvd.allreduce, x, process_set=hvd.ProcessSet([w.r]),
                  contains="not registered")
    # ... and the sets still work.
    check(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after_errors",
                        process_set=w.mine).item() == w.sn, "set after errors")


def test_add_remove(w):
    # A static set can be removed; the sets left go on.
    odd_id = w.odd.process_set_id
    check(hvd.remove_process_set(w.odd) is True and w.odd.process_set_id is None, "remove odd")
    if w.r % 2 == 0:
        check(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after_remove",
                            process_set=w.even).item() == w.sn, "even set after removing odd")
    # Ranks that disagree on the list fail on every rank (rank 0's [0] is
    # also refused by itself: it exists already as the even set).
    expect_raises(ValueError, hvd.add_process_set, [w.r], contains="the ranks disagree")
    ranks = [0, w.n - 1] if w.n > 2 else [1]
    dyn = hvd.add_process_set(hvd.ProcessSet(ranks))
    check(dyn.process_set_id > odd_id and dyn.ranks == ranks, repr(dyn))
    member = w.r in ranks
    check(dyn.included() is member, "included")
    pending = None
    if member:
        check(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="dyn", process_set=dyn).item() ==
              len(ranks), "allreduce on an added set")
        if dyn.rank() == 0:  # nobody else submits it: still pending at removal
            pending = hvd.allreduce_async(torch.ones(1), name="never.%d" % w.r, process_set=dyn)
    old_id = dyn.process_set_id
    check(hvd.remove_process_set(dyn) is True, "remove_process_set")
    check(dyn.process_set_id is None and hvd.remove_process_set(dyn) is False, "removed once")
    if pending is not None:
        expect_raises(hvd.KoloInternalError, hvd.synchronize, pending)
    expect_raises(ValueError, hvd.allreduce, torch.ones(1), process_set=dyn,
                  contains="not registered")
    # Ids are never reused; the same ranks may be added again.
    again = hvd.add_process_set(ranks)
    check(again.process_set_id > old_id, "a new id")
    if member:
        check(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="dyn", process_set=again).item() ==
              len(ranks), "allreduce on the set added again")
    check(hvd.remove_process_set(again) is True, "remove again")


def main():
    torch.set_num_threads(1)
    # Static sets are registered by init itself: build them from the size
    # kolorun gives every rank (KOLO_SIZE).
    n_env = int(os.environ.get("KOLO_SIZE", "0"))
    even = hvd.ProcessSet(range(0, n_env, 2))
    odd = hvd.ProcessSet(range(1, n_env, 2))
    hvd.init(process_sets=[even, odd])
    w = World(even, odd)
    check(w.n == n_env, "KOLO_SIZE")
    for test in [test_registration, test_allreduce, test_broadcast, test_allgather,
                 test_alltoall, test_reducescatter, test_grouped, test_barrier, test_independent,
                 test_optimizer,
                 test_errors, test_add_remove]:
        test(w)
        hvd.barrier()
        print("passed %s" % test.__name__, flush=True)
    hvd.shutdown()
    check(even.process_set_id is None and odd.process_set_id is None,
          "sets are forgotten at shutdown")
    check(hvd.global_process_set.process_set_id == 0, "the global set stays")
    print("WORKER-OK rank %d" % w.r)


if __name__ == "__main__":
    sys.exit(main())
