"""DistributedOptimizer: averages gradients across ranks while backward runs.

A hook on each parameter's gradient accumulator starts that gradient's
in-place allreduce as soon as autograd has accumulated it, so communication
overlaps the rest of the backward pass; ``step()`` waits for all of them
(submitting any that never fired) and then runs the wrapped optimizer.

``gradient_as_bucket_view=True`` places every dense gradient in one block
of agent-shared memory (kolo_alloc_shared): the allreduces are then zero
copy, libkolo copies nothing in or out.
"""

import warnings
import weakref
from contextlib import contextmanager

import torch

from .. import basics as _basics
from . import mpi_ops
from .adasum_optimizer import _DistributedAdasumOptimizer
from .compression import Compression
from .mpi_ops import Adasum, Average, synchronize
from .process_sets import global_process_set
from .process_sets import resolve as _resolve_set
from .shared import SharedBuffer, align_up


def _parameter_names(param_groups, named_parameters):
    """id(parameter) -> its name, checked as Horovod checks it (unique names,
    every parameter of the optimizer named); unnamed parameters get
    noname.<group>.<index>."""
    all_params = [p for g in param_groups for p in g["params"]]
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [("noname.%d.%d" % (i, j), v)
                            for i, g in enumerate(param_groups)
                            for j, v in enumerate(g["params"])]
    if any(not isinstance(p, tuple) or len(p) != 2 for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    names = [k for k, _ in named_parameters]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError("parameter names in named_parameters must be unique; duplicates: %s"
                         % ", ".join(dups))
    named_ids = {id(v) for _, v in named_parameters}
    unnamed = [id(p) for p in all_params if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was given but %d parameter(s) of the optimizer are "
                         "not in it (python ids %s)" % (len(unnamed), unnamed[:5]))
    return {id(v): k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}


class _DistributedOptimizer(torch.optim.Optimizer):
    # Becomes a method of a subclass of the user's optimizer class (see
    # DistributedOptimizer below): super(self.__class__, self) is that class.

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=global_process_set, gradient_as_bucket_view=False):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        # A rank outside the set takes no part (Horovod): its gradients stay
        # local, step() is the wrapped optimizer's own.
        members = getattr(process_set, "ranks", None)
        self._included = members is None or _basics.rank() in members
        # Gradients are averaged within the set (its size divides Average).
        self._set_size = (_resolve_set(process_set, "DistributedOptimizer").size
                          if self._included else 1)
        self.backward_passes_per_step = backward_passes_per_step

        all_params = [p for g in self.param_groups for p in g["params"]]
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)

        self._requires_update = [p for p in all_params if p.requires_grad]
        self._allreduce_delay = {p: backward_passes_per_step for p in self._requires_update}
        self._handles = {}
        self._grad_accs = []
        self._hook_handles = []
        self._synchronized = False
        self._should_synchronize = True

        # Groups: each group's gradients go out as one grouped allreduce once
        # all of them are ready.
        self._groups = None
        self._p_to_group = {}
        self._group_counts = {}
        if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:
            k = groups
            n = len(self._requires_update)
            chunks = [self._requires_update[i * n // k:(i + 1) * n // k] for i in range(k)]
            self._groups = [tuple(c) for c in chunks if c]
        elif isinstance(groups, (list, tuple)) and groups:
            wanted = {id(p) for p in self._requires_update}
            self._groups = []
            for g in groups:
                g = tuple(p for p in g if id(p) in wanted)
                if g:
                    self._groups.append(g)
        if self._groups is not None:
            for g in self._groups:
                self._group_counts[g] = 0
                for p in g:
                    self._p_to_group[p] = g

        self._bucket = None
        self._bucket_views = {}
        if gradient_as_bucket_view:
            self._setup_bucket()

        if self._set_size > 1:
            self._register_hooks()

    # ---- zero-copy gradient storage -------------------------------------

    def _setup_bucket(self):
        for p in self._requires_update:
            if p.device.type != "cpu":
                raise ValueError(
                    "DistributedOptimizer(gradient_as_bucket_view=True) keeps gradients in "
                    "agent-shared host memory; parameter on %s: on CUDA it is not available yet "
                    "(the device arena twin is issue 16, part 5); leave it False" % p.device)
        layout, total = [], 0
        for p in self._requires_update:
            nbytes = p.numel() * p.element_size()
            layout.append((p, total))
            total = align_up(total + nbytes, 64)
        if total == 0:
            return
        self._bucket = SharedBuffer(total)
        for p, off in layout:
            view = self._bucket.view(off, p.shape, p.dtype)
            with torch.no_grad():
                if p.grad is not None and not p.grad.is_sparse:
                    view.copy_(p.grad)
                else:
                    view.zero_()
            p.grad = view
            self._bucket_views[p] = view

    def _use_bucket_view(self, p):
        view = self._bucket_views.get(p)
        if view is None or p.grad is None or p.grad.is_sparse:
            return
        if p.grad.data_ptr() != view.data_ptr():
            with torch.no_grad():
                view.copy_(p.grad)
            p.grad = view

    # ---- hooks -----------------------------------------------------------

    def _register_hooks(self):
        # The hooks hold the optimizer weakly: once it is dropped, they do
        # nothing (and __del__ removes them), so wrapping a model again later
        # does not reduce each gradient twice.
        ref = weakref.ref(self)
        for p in self._requires_update:
            # The gradient accumulation node of p: its hooks run right after
            # p.grad has been updated.
            grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hook_handles.append(grad_acc.register_hook(_grad_hook(ref, p)))
            self._grad_accs.append(grad_acc)

    def _remove_hooks(self):
        for h in getattr(self, "_hook_handles", []):
            try:
                h.remove()
            except Exception:
                pass
        self._hook_handles = []

    def __del__(self):
        self._remove_hooks()

    def _on_grad_ready(self, p):
        if p in self._handles and self._handles[p][0] is not None:
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "kolo: gradients were computed more than backward_passes_per_step times "
                    "before step(); increase backward_passes_per_step to accumulate "
                    "gradients locally")
        handle, ctx = None, None
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] == 0:
            if self._groups is not None and p in self._p_to_group:
                group = self._p_to_group[p]
                self._group_counts[group] += 1
                if self._group_counts[group] == len(group):
                    self._handles[group] = self._grouped_allreduce_grad_async(group)
                    for gp in group:
                        self._handles.pop(gp, None)
                    self._group_counts[group] = 0
                    return
            else:
                handle, ctx = self._allreduce_grad_async(p)
        self._handles[p] = (handle, ctx)

    # ---- allreduce of one gradient / one group ----------------------------

    def _scale_factors(self):
        if self.op == Average:
            # The agent divides by the size for Average; split the division
            # between before and after the sum as asked.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _prepare_grad(self, p):
        if p.grad is None:
            # This rank computed no gradient for p, but others may have: send zeros.
            p.grad = torch.zeros_like(p.data)
        self._use_bucket_view(p)
        tensor = p.grad
        if tensor.is_sparse and self.sparse_as_dense:
            tensor = tensor.to_dense()
        return tensor

    def _allreduce_grad_async(self, p):
        name = self._parameter_names.get(id(p))
        tensor = self._prepare_grad(p)
        if tensor.is_sparse:
            return mpi_ops.sparse_allreduce_async(tensor, name=name, op=self.op,
                                                  process_set=self.process_set), None
        compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scale_factors()
        handle = mpi_ops.allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                          postscale_factor=post, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group):
        tensors, ctxs = [], []
        for p in group:
            t = self._prepare_grad(p)
            if t.is_sparse:
                raise ValueError("kolo DistributedOptimizer: groups cannot hold parameters with "
                                 "sparse gradients (use sparse_as_dense=True)")
            c, ctx = self._compression.compress(t)
            tensors.append(c)
            ctxs.append(ctx)
        pre, post = self._scale_factors()
        name = "group." + self._parameter_names.get(id(group[0]), "noname")
        handle = mpi_ops.grouped_allreduce_async_(tensors, name=name, op=self.op,
                                                  prescale_factor=pre, postscale_factor=post,
                                                  process_set=self.process_set)
        return handle, ctxs

    def _apply_result(self, p, output, ctx):
        self._allreduce_delay[p] = self.backward_passes_per_step
        result = self._compression.decompress(output, ctx)
        with torch.no_grad():
            if p.grad.is_sparse:
                if not result.is_sparse:
                    result = result.to_sparse()
                p.grad.zero_().add_(result)
            elif result is not p.grad:
                if result.is_sparse:
                    result = result.to_dense()
                p.grad.copy_(result)

    # ---- public API ------------------------------------------------------

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those whose hook did
        not fire) and writes the averaged gradients into p.grad."""
        if not self._included or (self._set_size == 1 and not self._handles):
            self._synchronized = True
            return
        done = set()
        for key in self._handles:
            if isinstance(key, tuple):
                done.update(id(p) for p in key)
            else:
                done.add(id(key))
        errors = []
        try:
            for p in self._requires_update:
                if id(p) not in done:
                    self._handles[p] = self._allreduce_grad_async(p)
            for key, (handle, ctx) in list(self._handles.items()):
                if handle is None:
                    self._handles[key] = self._allreduce_grad_async(key)
        except Exception as e:  # still wait for what was submitted
            errors.append(e)
        for key, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                continue
            try:
                output = synchronize(handle)
            except Exception as e:
                errors.append(e)
                continue
            if isinstance(key, tuple):
                for gp, out, gctx in zip(key, output, ctx):
                    self._apply_result(gp, out, gctx)
            else:
                self._apply_result(key, output, ctx)
        self._handles.clear()
        for p in self._requires_update:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for g in self._group_counts:
            self._group_counts[g] = 0
        self._synchronized = True
        if errors:
            raise errors[0]

    @contextmanager
    def skip_synchronize(self):
        """Inside this block step() does not synchronize (call synchronize()
        yourself first, e.g. to clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # Horovod's text, word for word (scripts and tests match it).
                warnings.warn("optimizer.step() called without "
                              "optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if any(h is not None for h, _ in self._handles.values()):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(); the "
                                 "gradients are still being reduced")
        if self._bucket is not None:
            # Keep the shared views: zero them in place.
            for p in self._requires_update:
                if p.grad is not None:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()
            return None
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def _grad_hook(ref, p):
    def hook(*ignore):
        opt = ref()
        if opt is not None:
            opt._on_grad_ready(p)
    return hook


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set, gradient_as_bucket_view=False):
    """Wraps a torch optimizer so that gradients are averaged (op) across all
    ranks -- or the ranks of `process_set` -- before each step (Horovod's
    hvd.DistributedOptimizer).

    named_parameters: model.named_parameters(), naming each allreduce.
    compression: Compression.none or Compression.fp16.
    backward_passes_per_step: local accumulation passes before a reduction.
    op: Average (default), Sum, Min, Max, Product, or Adasum (Horovod's
        delta optimizer: each rank's step on a parameter, combined with
        Adasum; global process set only; see adasum_optimizer.py).
    gradient_predivide_factor: with Average, divide by this before the sum
        and multiply after it.
    groups / num_groups: an int (that many groups of parameters, in order) or
        a list of lists of parameters; each group is reduced together.
    sparse_as_dense: reduce sparse gradients as dense tensors.
    gradient_as_bucket_view: keep every gradient in agent-shared memory so
        the reductions are zero copy.
    process_set: reduce within this registered set only (Average divides by
        its size); every member must build the same optimizer. A rank
        outside the set gets ValueError.
    """
    members = getattr(process_set, "ranks", None)
    if members is None or _basics.rank() in members:  # (outside the set: nothing to check)
        _resolve_set(process_set, "DistributedOptimizer")  # ValueError: not registered
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is only supported with op=Average")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be a positive int, got %r"
                         % (backward_passes_per_step,))
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups=", DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if groups is not None:
        ok = (isinstance(groups, int) and not isinstance(groups, bool) and groups >= 0) or (
            isinstance(groups, (list, tuple)) and all(
                isinstance(g, (list, tuple)) and all(torch.is_tensor(p) for p in g)
                for g in groups))
        if not ok:
            raise ValueError("groups should be a non-negative int or a list of lists of "
                             "torch.Tensor")
    if op == Adasum and _basics.size() > 1:
        if process_set is not global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        if sparse_as_dense or groups or gradient_as_bucket_view:
            raise ValueError("DistributedOptimizer(op=Adasum) combines each parameter's step "
                             "on its own: groups, sparse_as_dense and gradient_as_bucket_view "
                             "do not apply")
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        dist = cls(optimizer.param_groups,
                   _parameter_names(optimizer.param_groups, named_parameters), compression,
                   backward_passes_per_step)
        dist.state = optimizer.state
        return dist
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    dist = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set,
               gradient_as_bucket_view)
    dist.state = optimizer.state  # keep any state the optimizer already has
    return dist
