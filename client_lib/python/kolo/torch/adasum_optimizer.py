"""DistributedOptimizer(op=Adasum): Horovod's delta optimizer.

Adasum combines what each rank would do to a parameter, not its gradient:
as soon as a parameter's gradient is ready, the wrapped optimizer takes a
step on that parameter alone, the step's change (delta = new - old) is
combined across ranks with Adasum (adasum.py), and step() sets the
parameter to old + combined delta. Learning-rate schedules, momentum and
Adam's moments therefore act per rank, as the Adasum paper prescribes.
"""

import weakref

import torch

from . import mpi_ops


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    # Becomes a method of a subclass of the user's optimizer class (see
    # optimizer.DistributedOptimizer): super(self.__class__, self) is that class.

    def __init__(self, params, parameter_names, compression, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._parameter_names = parameter_names  # id(p) -> name
        self.backward_passes_per_step = backward_passes_per_step
        self._requires_update = [p for g in self.param_groups for p in g["params"]
                                 if p.requires_grad]
        self._allreduce_delay = {p: backward_passes_per_step for p in self._requires_update}
        self._start = {p: torch.zeros_like(p, requires_grad=False)
                       for p in self._requires_update}
        self._handles = {}
        self._hook_handles = []
        self._grad_accs = []
        ref = weakref.ref(self)
        for p in self._requires_update:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hook_handles.append(grad_acc.register_hook(_hook(ref, p)))
            self._grad_accs.append(grad_acc)

    def __del__(self):
        for h in getattr(self, "_hook_handles", []):
            try:
                h.remove()
            except Exception:
                pass

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _local_step(self, p):
        """The wrapped optimizer's step on p alone; p then holds the delta."""
        stashed = [g["params"] for g in self.param_groups]
        for g in self.param_groups:
            g["params"] = [p] if any(p is v for v in g["params"]) else []
        try:
            with torch.no_grad():
                self._start[p].copy_(p)
            super(self.__class__, self).step()
            with torch.no_grad():
                p.sub_(self._start[p])
        finally:
            for g, params in zip(self.param_groups, stashed):
                g["params"] = params

    def _delta_async(self, p):
        self._local_step(p)
        name = self._parameter_names.get(id(p))
        return mpi_ops.allreduce_async_(p.data, name=name, op=mpi_ops.Adasum,
                                        compression=self._compression)

    def _on_grad_ready(self, p):
        if self._handles.get(p) is not None and self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "kolo: gradients were computed more than backward_passes_per_step times "
                "before step(); increase backward_passes_per_step to accumulate "
                "gradients locally")
        self._allreduce_delay[p] -= 1
        self._handles[p] = self._delta_async(p) if self._allreduce_delay[p] == 0 else None

    def synchronize(self):
        pass  # the deltas are applied by step()

    def skip_synchronize(self):
        raise AssertionError("skip_synchronize() is not supported with op=Adasum: step() "
                             "applies the combined deltas")

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for p in self._requires_update:
            if self._handles.get(p) is None:  # its hook never fired, or fewer passes
                self._handles[p] = self._delta_async(p)
        for p, handle in self._handles.items():
            delta = mpi_ops.synchronize(handle)
            with torch.no_grad():
                self._start[p].add_(delta)
                p.copy_(self._start[p])
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step(); this is prohibited as it can cause a "
                                 "race condition")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def _hook(ref, p):
    def hook(*ignore):
        opt = ref()
        if opt is not None:
            opt._on_grad_ready(p)
    return hook
