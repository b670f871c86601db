"""Whole-model helpers: broadcasting parameters, optimizer state and Python
objects, and gathering objects (Horovod's torch/functions.py API)."""

import io
import pickle

import torch

from .. import basics
from .mpi_ops import (_check_root, _prologue, allgather_async, broadcast_, broadcast_async_,
                      synchronize)
from .process_sets import global_process_set

try:  # cloudpickle handles lambdas and local classes; plain pickle otherwise
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle


def _dumps(obj):
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return buf.getvalue()


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites, in place, every tensor of `params` with the root rank's.

    `params` is a dict (``model.state_dict()``, broadcast in sorted-key order)
    or a list of tensors or (name, tensor) pairs (``model.named_parameters()``).
    All broadcasts are submitted first, then waited for. With a process set
    only its ranks take part; root_rank is a global rank in the set.
    """
    pset = _prologue("broadcast_parameters", process_set)
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("broadcast_parameters: invalid params of type %s" % type(params).__name__)
    _check_root(root_rank, "broadcast_parameters", pset)
    handles = []
    try:
        for i, (name, p) in enumerate(items):
            if p is None:
                continue
            if not torch.is_tensor(p):
                raise ValueError("broadcast_parameters: %s is a %s, not a tensor"
                                 % (name if name is not None else "item %d" % i, type(p).__name__))
            with torch.no_grad():
                handles.append(broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p,
                                                root_rank, name=None if name is None else
                                                "param.%s" % name, process_set=process_set))
    finally:
        errors = []
        for h in handles:
            try:
                synchronize(h)
            except Exception as e:  # wait for all, report the first
                errors.append(e)
    if errors:
        raise errors[0]


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns the root rank's `obj` on every rank of `process_set` (pickled,
    then sent as bytes: a length, then the payload)."""
    pset = _prologue("broadcast_object", process_set)
    _check_root(root_rank, "broadcast_object", pset)
    if name is None:
        name = type(obj).__name__
    if basics.rank() == root_rank:
        payload = _dumps(obj)
        size = torch.tensor([len(payload)], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    broadcast_(size, root_rank, name=name + ".sz", process_set=process_set)
    n = int(size.item())
    if basics.rank() == root_rank:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if n else \
            torch.zeros(0, dtype=torch.uint8)
    else:
        data = torch.zeros(n, dtype=torch.uint8)
    broadcast_(data, root_rank, name=name + ".t", process_set=process_set)
    if basics.rank() == root_rank:
        return obj
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj` (of `process_set`), in rank
    order."""
    _prologue("allgather_object", process_set)
    if name is None:
        name = type(obj).__name__
    payload = _dumps(obj)
    t = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    sizes = synchronize(allgather_async(torch.tensor([len(payload)], dtype=torch.int64),
                                        name=name + ".sz", process_set=process_set)).tolist()
    gathered = synchronize(allgather_async(t, name=name + ".t",
                                           process_set=process_set)).numpy().tobytes()
    out, off = [], 0
    for n in sizes:
        out.append(pickle.loads(gathered[off:off + n]))
        off += n
    return out


def _init_optimizer_state(optimizer, model):
    """Horovod's initialization of a fresh optimizer: every parameter that
    requires a gradient gets a zero one (sparse for SparseAdam, and for SGD
    on a sparse Embedding of `model`), then one local step of the wrapped
    torch optimizer (no collective: a DistributedOptimizer's own step would
    allreduce)."""
    sparse_params = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse_params.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                sparse = isinstance(optimizer, torch.optim.SparseAdam) or (
                    isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_params)
                if p.grad is not None and not p.grad.is_sparse and not sparse:
                    with torch.no_grad():
                        p.grad.zero_()  # in place: keeps a zero-copy gradient view
                else:
                    p.grad = p.data.new(p.size()).zero_()
                    if sparse:
                        p.grad = p.grad.to_sparse()
    from . import optimizer as _opt
    if type(optimizer).__module__ == _opt.__name__:  # a DistributedOptimizer (see optimizer.py)
        super(optimizer.__class__, optimizer).step()
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state (per-parameter state and the
    options of each param group, e.g. the learning rate) equal to the root's.

    Works with plain torch optimizers and kolo DistributedOptimizers. As in
    Horovod, a rank whose optimizer has no state yet first initializes it:
    zero gradients (sparse ones for SparseAdam, and for SGD on the sparse
    Embeddings of `model`) and one local step of the wrapped optimizer. The
    root's state layout (keys, shapes, dtypes, non-tensor values, param
    group options) is then broadcast as an object; every rank creates or
    drops state entries to match it, and the tensors are broadcast in place.
    """
    pset = _prologue("broadcast_optimizer_state", process_set)
    _check_root(root_rank, "broadcast_optimizer_state", pset)
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state: torch.optim.LBFGS state cannot be broadcast")
    if len(optimizer.state_dict()["state"]) == 0:
        _init_optimizer_state(optimizer, model)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    sd = optimizer.state_dict()  # per-param state dicts are the live ones
    layout = None
    if basics.rank() == root_rank:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
        state = {}
        for pid, st in sd["state"].items():
            # Tensors on a GPU are created on the parameter's device on the
            # other ranks (each rank's own GPU), CPU ones on the CPU.
            state[pid] = {k: (("tensor", tuple(v.shape), v.dtype, v.device.type != "cpu")
                              if torch.is_tensor(v) else ("value", v)) for k, v in st.items()}
        layout = {"groups": groups, "state": state, "nparams": len(params)}
    layout = broadcast_object(layout, root_rank, name="optimizer_state.layout",
                              process_set=process_set)
    if layout["nparams"] != len(params) or len(layout["groups"]) != len(optimizer.param_groups):
        raise ValueError(
            "broadcast_optimizer_state: rank %d's optimizer has %d param groups / %d parameters, "
            "the root's has %d / %d" % (basics.rank(), len(optimizer.param_groups), len(params),
                                        len(layout["groups"]), layout["nparams"]))
    for group, opts in zip(optimizer.param_groups, layout["groups"]):
        group.update(opts)

    to_send = []
    for pid in sorted(layout["state"]):
        p = params[pid]
        old = optimizer.state.get(p, {})
        st = {}  # rebuilt in the root's key order
        for k, kind in layout["state"][pid].items():
            if kind[0] == "tensor":
                shape, dtype = kind[1], kind[2]
                device = p.device if len(kind) > 3 and kind[3] else torch.device("cpu")
                cur = old.get(k)
                if not (torch.is_tensor(cur) and tuple(cur.shape) == shape and cur.dtype == dtype
                        and cur.device == device):
                    cur = torch.zeros(shape, dtype=dtype, device=device)
                st[k] = cur
                to_send.append(("opt.%d.%s" % (pid, k), cur))
            else:
                st[k] = kind[1]
        optimizer.state[p] = st
    pid_of = {id(p): i for i, p in enumerate(params)}
    for p in list(optimizer.state.keys()):
        if pid_of.get(id(p)) not in layout["state"]:
            del optimizer.state[p]
    broadcast_parameters(to_send, root_rank, process_set=process_set)
