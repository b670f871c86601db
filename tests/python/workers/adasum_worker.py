"""Adasum (op=hvd.Adasum) against a reference computed here, independently
of kolo.torch.adasum: allreduce of several dtypes and shapes (with prescale
and postscale, in place and async), the exact cases (orthogonal gradients
add, equal ones stay), the errors, and DistributedOptimizer(op=Adasum)
against every rank's SGD step combined by the reference. argv: none."""

import torch

import kolo.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
failures = []


def ref_pair(a, b):
    # Horovod's formula, written out: dot and norms in float64.
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    dot = float((a64 * b64).sum())
    na = float((a64 * a64).sum())
    nb = float((b64 * b64).sum())
    ca = 1.0 - 0.5 * dot / na if na >= 1e-8 else 1.0
    cb = 1.0 - 0.5 * dot / nb if nb >= 1e-8 else 1.0
    return (ca * a64 + cb * b64).to(a.dtype)


def ref_adasum(vs):
    # Horovod's tree: the first power-of-two block against the rest.
    if len(vs) == 1:
        return vs[0]
    p = 1
    while p * 2 < len(vs):
        p *= 2
    return ref_pair(ref_adasum(vs[:p]), ref_adasum(vs[p:]))


def data(k, shape, dtype, seed):
    g = torch.Generator().manual_seed(seed * 100 + k)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * (k + 1)).to(dtype)


def check(tag, got, want, tol):
    if got.dtype != want.dtype or got.shape != want.shape:
        failures.append("%s: dtype/shape %s %s vs %s %s" % (tag, got.dtype, tuple(got.shape),
                                                            want.dtype, tuple(want.shape)))
        return
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    scale = max(want.double().abs().max().item(), 1.0) if want.numel() else 1.0
    if err > tol * scale:
        failures.append("%s: max error %g (tolerance %g)" % (tag, err, tol * scale))


TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3}
seed = 0
for dtype, tol in TOL.items():
    for shape in [(5,), (17, 3), (1000,)]:
        seed += 1
        xs = [data(k, shape, dtype, seed) for k in range(n)]
        want = ref_adasum([x.reshape(-1) for x in xs]).reshape(shape)
        check("allreduce %s %s" % (dtype, shape), hvd.allreduce(xs[r], op=hvd.Adasum), want, tol)
        t = xs[r].clone()
        hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Adasum, name="ada.%d" % seed))
        check("allreduce_ %s %s" % (dtype, shape), t, want, tol)
    if dtype != torch.float16:
        seed += 1
        xs = [data(k, (33,), dtype, seed) for k in range(n)]
        pre = [x * torch.tensor(0.5, dtype=dtype) for x in xs]
        want = ref_adasum(pre) * torch.tensor(3.0, dtype=dtype)
        got = hvd.allreduce(xs[r], op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0)
        check("scaled %s" % dtype, got, want, tol)

# Exact cases: gradients with disjoint support add; equal gradients stay.
x = torch.zeros(4 * n, dtype=torch.float64)
x[4 * r:4 * r + 4] = torch.arange(1, 5, dtype=torch.float64) * (r + 1)
want = torch.cat([torch.arange(1, 5, dtype=torch.float64) * (k + 1) for k in range(n)])
got = hvd.allreduce(x, op=hvd.Adasum)
if not torch.equal(got, want):
    failures.append("orthogonal gradients did not add exactly: %s vs %s" % (got, want))
same = torch.linspace(-2, 3, 10, dtype=torch.float64)
got = hvd.allreduce(same, op=hvd.Adasum)
if not torch.equal(got, same):
    failures.append("equal gradients changed: %s vs %s" % (got, same))

# Errors: integers, and collectives that take no Adasum.
try:
    hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)
    failures.append("int32 Adasum accepted")
except ValueError as e:
    if "Adasum combines floating point tensors only" not in str(e):
        failures.append("int32 error text: %s" % e)
try:
    hvd.grouped_allreduce([torch.ones(3)], op=hvd.Adasum)
    failures.append("grouped Adasum accepted")
except NotImplementedError as e:
    if "Adasum in grouped_allreduce" not in str(e):
        failures.append("grouped error text: %s" % e)

# DistributedOptimizer(op=Adasum): each rank's SGD step on its own batch,
# the steps combined by Adasum, added to the start.
torch.manual_seed(7)
model = torch.nn.Linear(6, 3).double()
p0 = {k: v.detach().clone() for k, v in model.named_parameters()}
batches = [(data(k, (8, 6), torch.float64, 900), data(k, (8, 3), torch.float64, 901))
           for k in range(n)]
deltas = []
for k in range(n):
    m = torch.nn.Linear(6, 3).double()
    with torch.no_grad():
        for name, v in m.named_parameters():
            v.copy_(p0[name])
    torch.nn.functional.mse_loss(m(batches[k][0]), batches[k][1]).backward()
    deltas.append({name: -0.1 * v.grad for name, v in m.named_parameters()})
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), op=hvd.Adasum)
opt.zero_grad()
torch.nn.functional.mse_loss(model(batches[r][0]), batches[r][1]).backward()
opt.step()
for name, v in model.named_parameters():
    combined = ref_adasum([d[name].reshape(-1) for d in deltas]).reshape(v.shape)
    check("optimizer %s" % name, v.detach(), p0[name] + combined, 1e-12)
# ... and the parameters agree on every rank.
for name, v in model.named_parameters():
    gathered = hvd.allgather(v.detach().reshape(1, -1), name="opt.check." + name)
    if not all(torch.equal(gathered[0], gathered[k]) for k in range(n)):
        failures.append("optimizer %s differs between ranks" % name)

if failures:
    print("FAILURES rank %d: %s" % (r, "; ".join(failures)), flush=True)
else:
    print("WORKER-OK rank %d" % r, flush=True)
hvd.shutdown()
