"""Horovod's SyncBatchNorm on kolo: batch normalization whose statistics
are those of the whole batch, across the ranks of a process set.

In training (with more than one rank in the set) every rank computes its
batch's per-channel count, mean and sum of squared deviations (in float64),
and one allgather gives every rank all of them; they combine into the
global mean and biased variance exactly as one process would over the
concatenated batch (Chan's parallel formula). The backward pass allreduces
the per-channel sums of dy and dy * x_hat, so the input gradient is that of
the whole batch; the weight and bias gradients stay local (the
DistributedOptimizer averages them, as in Horovod and torch). Running stats
use the unbiased global variance. Ranks may hold different batch sizes.
"""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .mpi_ops import Sum, allgather, allreduce
from .process_sets import global_process_set
from .process_sets import resolve as _resolve_set


class SyncBatchNorm(_BatchNorm):
    """Drop-in for torch.nn.BatchNorm{1,2,3}d (input (N, C, ...)), with
    Horovod's arguments; `process_set=` limits the synchronization to a set."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def _factor(self):
        if self.momentum is None:
            if self.training and self.track_running_stats and self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
                return 1.0 / float(self.num_batches_tracked)
            return 0.0
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        return self.momentum

    def forward(self, input):
        self._check_input_dim(input)
        factor = self._factor()
        sync = self.training and _resolve_set(self.process_set, "SyncBatchNorm").size > 1
        if not sync:
            return torch.nn.functional.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias,
                self.training or not self.track_running_stats, factor, self.eps)
        update = self.track_running_stats and self.running_mean is not None
        return _SyncBatchNormFn.apply(input, self.weight, self.bias,
                                      self.running_mean if update else None,
                                      self.running_var if update else None,
                                      self.eps, factor, self.process_set)


def _shape(c, x):
    return [1, c] + [1] * (x.dim() - 2)


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        xd = x.detach().to(torch.float64)
        n = x.numel() // c if c else 0
        mean = xd.mean(dims) if n else torch.zeros(c, dtype=torch.float64)
        m2 = ((xd - mean.view(_shape(c, x))) ** 2).sum(dims) if n else torch.zeros(
            c, dtype=torch.float64)
        stats = torch.cat([torch.tensor([float(n)], dtype=torch.float64), mean, m2]).view(1, -1)
        allst = allgather(stats, name=None, process_set=process_set)
        counts, means, m2s = allst[:, 0], allst[:, 1:1 + c], allst[:, 1 + c:]
        total = counts.sum()
        if total <= 1:
            raise ValueError("SyncBatchNorm: expected more than 1 value per channel when "
                             "training, got %d in all" % int(total))
        gmean = (counts.view(-1, 1) * means).sum(0) / total
        gm2 = (m2s + counts.view(-1, 1) * (means - gmean) ** 2).sum(0)
        var = gm2 / total
        invstd = 1.0 / torch.sqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(momentum * gmean.to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_(
                    momentum * (gm2 / (total - 1)).to(running_var.dtype))
        shp = _shape(c, x)
        xhat = (xd - gmean.view(shp)) * invstd.view(shp)
        y = xhat
        if weight is not None:
            y = y * weight.detach().to(torch.float64).view(shp)
        if bias is not None:
            y = y + bias.detach().to(torch.float64).view(shp)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total, ctx.process_set, ctx.has_bias = total, process_set, bias is not None
        ctx.dtype = x.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, weight = ctx.saved_tensors
        c = xhat.shape[1]
        dims = [0] + list(range(2, xhat.dim()))
        shp = _shape(c, xhat)
        dyd = dy.to(torch.float64)
        sum_dy = dyd.sum(dims)
        sum_dy_xhat = (dyd * xhat).sum(dims)
        grad_weight = sum_dy_xhat.to(weight.dtype) if weight is not None else None
        grad_bias = sum_dy.to(weight.dtype if weight is not None else ctx.dtype) \
            if ctx.has_bias else None
        both = allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=Sum, process_set=ctx.process_set)
        mean_dy, mean_dy_xhat = both[:c] / ctx.total, both[c:] / ctx.total
        scale = invstd if weight is None else invstd * weight.detach().to(torch.float64)
        dx = (dyd - mean_dy.view(shp) - xhat * mean_dy_xhat.view(shp)) * scale.view(shp)
        return dx.to(ctx.dtype), grad_weight, grad_bias, None, None, None, None, None
