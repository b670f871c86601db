"""Adasum (Maleki et al., "Scaling Distributed Training with Adaptive
Summation", MLSys 2021), as Horovod defines it: op=Adasum in allreduce and
DistributedOptimizer.

Two gradients a and b combine as

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(a coefficient is 1 where that vector's squared norm is below 1e-8):
orthogonal gradients add, equal ones average, and anything between is
weighted by how much the two agree. Over n ranks the pairs form Horovod's
tree: at distance 1 ranks (0,1), (2,3), ... combine, at distance 2 the
results of (0,1) and (2,3), and so on, each level's result rounded to the
tensor's dtype (Horovod stores every level in the tensor's own type; the
dot product and the norms are taken in float64, as Horovod takes them).
For a size that is not a power of two the block without a partner passes
up a level unchanged (Horovod refuses such sizes; kolo serves them).

How kolo runs it: every rank's tensor is gathered (one kolo allgather over
the process set) and every rank evaluates the same tree in the same order,
so every rank holds the same bits. That moves size times the data an
allreduce moves: fine for the optimizer's deltas of moderate models, not a
bandwidth-optimal Adasum (Horovod's recursive halving); see
docs/user-guide-python.md.
"""

import torch

# Horovod's threshold below which a squared norm counts as zero.
_NORM_EPS = 1e-8

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_dtype(tensor, op_name):
    if tensor.dtype not in FLOAT_DTYPES:
        raise ValueError("kolo %s: Adasum combines floating point tensors only (float16, "
                         "bfloat16, float32, float64); got %s" % (op_name, tensor.dtype))


def combine(a, b):
    """adasum(a, b) for two flat tensors of one dtype, rounded to it."""
    a64, b64 = a.double(), b.double()
    dot = torch.dot(a64, b64).item()
    anormsq = torch.dot(a64, a64).item()
    bnormsq = torch.dot(b64, b64).item()
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= _NORM_EPS else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= _NORM_EPS else 1.0
    return (acoeff * a64 + bcoeff * b64).to(a.dtype)


def tree(rows):
    """Adasum over the rows of a (n, count) tensor, in Horovod's pairing
    order; returns a (count,) tensor of the rows' dtype."""
    parts = [rows[i] for i in range(rows.shape[0])]
    n = len(parts)
    distance = 1
    while distance < n:
        for i in range(0, n, 2 * distance):
            if i + distance < n:
                parts[i] = combine(parts[i], parts[i + distance])
        distance *= 2
    return parts[0].clone() if n == 1 else parts[0]
