"""PyTorch Lightning on kolo: a ClusterEnvironment for kolorun's variables.

    import kolo.torch                                  # registers backend "kolo"
    from kolo.lightning import KoloEnvironment, trainer_kwargs
    from pytorch_lightning.strategies import DDPStrategy
    trainer = pl.Trainer(accelerator="cpu",
                         strategy=DDPStrategy(process_group_backend="kolo",
                                              cluster_environment=KoloEnvironment()),
                         **trainer_kwargs(), max_epochs=...)

Started with ``kolorun -np N python train.py``: kolorun starts every rank
(Lightning launches nothing) and KoloEnvironment reads the ranks and sizes
kolorun exports (KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK, ...) and torchrun's
MASTER_ADDR / MASTER_PORT, where rank 0 hosts torch's store.
``trainer_kwargs()`` gives the ``devices`` (ranks per node) and ``num_nodes``
Lightning wants to agree with the job. Works with ``pytorch_lightning`` and
``lightning`` (whichever is installed; docs/user-guide-python.md, "Lightning").
"""

import os

try:  # the standalone package (pytorch-lightning) ships lightning_fabric
    from lightning_fabric.plugins.environments import ClusterEnvironment
except ImportError:  # pragma: no cover - the unified "lightning" package
    from lightning.fabric.plugins.environments import ClusterEnvironment


def _int(name, *fallbacks):
    for n in (name,) + fallbacks:
        v = os.environ.get(n)
        if v not in (None, ""):
            return int(v)
    raise RuntimeError("kolo.lightning: %s is not set: start the script with kolorun "
                       "(kolorun -np N python train.py)" % name)


class KoloEnvironment(ClusterEnvironment):
    """Lightning's view of a kolorun job: processes are created by kolorun,
    rank and sizes come from its environment."""

    @property
    def creates_processes_externally(self):
        return True

    @property
    def main_address(self):
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self):
        return _int("MASTER_PORT")

    @staticmethod
    def detect():
        return "KOLO_JOB_ID" in os.environ and "KOLO_RANK" in os.environ

    def world_size(self):
        return _int("KOLO_SIZE", "WORLD_SIZE")

    def set_world_size(self, size):
        if size != self.world_size():
            raise RuntimeError(
                "kolo.lightning: Lightning computed a world size of %d (num_nodes x devices) but "
                "the kolorun job has %d ranks; pass **kolo.lightning.trainer_kwargs() to the "
                "Trainer" % (size, self.world_size()))

    def global_rank(self):
        return _int("KOLO_RANK", "RANK")

    def set_global_rank(self, rank):
        if rank != self.global_rank():
            raise RuntimeError(
                "kolo.lightning: Lightning computed global rank %d, kolorun gave this process "
                "rank %d; pass **kolo.lightning.trainer_kwargs() to the Trainer"
                % (rank, self.global_rank()))

    def local_rank(self):
        return _int("KOLO_LOCAL_RANK", "LOCAL_RANK")

    def node_rank(self):
        return _int("GROUP_RANK", "KOLO_CROSS_RANK")


def trainer_kwargs():
    """``devices`` and ``num_nodes`` for the Trainer: the ranks per node and
    the number of nodes of this kolorun job (every node the same number of
    ranks, as Lightning requires)."""
    size, local = _int("KOLO_SIZE"), _int("KOLO_LOCAL_SIZE")
    if size % local:
        raise RuntimeError("kolo.lightning: %d ranks do not split evenly into nodes of %d "
                           "(Lightning needs the same number of ranks on every node)"
                           % (size, local))
    return {"devices": local, "num_nodes": size // local}
