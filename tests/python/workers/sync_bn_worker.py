"""SyncBatchNorm against torch.nn.BatchNorm on the concatenated batch of
every rank (one process, float64): outputs, running stats, the input
gradient and the summed weight/bias gradients. Ranks hold different batch
sizes. argv: none."""

import torch

import kolo.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)
C = 3
sizes = [2 + k for k in range(n)]  # rank k holds 2 + k samples
shapes = {"1d": (C,), "2d": (C, 4), "4d": (C, 3, 2)}
failures = []
for tag, tail in shapes.items():
    xs = [torch.randn((sizes[k],) + tail, dtype=torch.float64) * (k + 1) + k for k in range(n)]
    gs = [torch.randn((sizes[k],) + tail, dtype=torch.float64) for k in range(n)]
    w0 = torch.randn(C, dtype=torch.float64)
    b0 = torch.randn(C, dtype=torch.float64)

    ref = (torch.nn.BatchNorm1d if len(tail) <= 2 else torch.nn.BatchNorm2d)(
        C, momentum=0.3).double()
    with torch.no_grad():
        ref.weight.copy_(w0)
        ref.bias.copy_(b0)
    xr = torch.cat(xs).requires_grad_()
    yr = ref(xr)
    (yr * torch.cat(gs)).sum().backward()

    bn = hvd.SyncBatchNorm(C, momentum=0.3).double()
    with torch.no_grad():
        bn.weight.copy_(w0)
        bn.bias.copy_(b0)
    x = xs[r].clone().requires_grad_()
    y = bn(x)
    (y * gs[r]).sum().backward()

    off = sum(sizes[:r])
    checks = {
        "y": (y, yr[off:off + sizes[r]]),
        "dx": (x.grad, xr.grad[off:off + sizes[r]]),
        "running_mean": (bn.running_mean, ref.running_mean),
        "running_var": (bn.running_var, ref.running_var),
        "dweight": (hvd.allreduce(bn.weight.grad, op=hvd.Sum), ref.weight.grad),
        "dbias": (hvd.allreduce(bn.bias.grad, op=hvd.Sum), ref.bias.grad),
    }
    for what, (got, want) in checks.items():
        err = (got.detach() - want.detach()).abs().max().item()
        if not err <= 1e-10:
            failures.append("%s %s: max error %g" % (tag, what, err))
    # eval mode: the running statistics, no communication
    bn.eval()
    ref.eval()
    with torch.no_grad():
        err = (bn(xs[r]) - ref(xs[r])).abs().max().item()
    if not err <= 1e-10:
        failures.append("%s eval: max error %g" % (tag, err))

# float32 input, and an error for a 1-D input
bn32 = hvd.SyncBatchNorm(C)
y32 = bn32(torch.randn(4, C))
assert y32.dtype == torch.float32
try:
    bn32(torch.randn(C))
    failures.append("1-D input accepted")
except ValueError as e:
    assert "expected at least 2D input" in str(e), e

if failures:
    print("FAILURES rank %d: %s" % (r, "; ".join(failures)), flush=True)
else:
    print("WORKER-OK rank %d" % r, flush=True)
hvd.shutdown()
