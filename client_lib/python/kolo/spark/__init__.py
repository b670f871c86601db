"""kolo on Spark: Horovod's horovod.spark.run API (docs/spark.md).

``kolo.spark.run(fn, args, kwargs, num_proc, ...)`` runs fn on num_proc
ranks, one per task of a Spark barrier stage, with one kolo-agent per
executor host and a private kolo-coordinator on the driver. Horovod's Spark
Estimators (KerasEstimator, TorchEstimator) are not part of kolo yet.
"""

from .runner import KoloSparkError, run  # noqa: F401
from ..errors import KoloNotImplementedError


def run_elastic(*args, **kwargs):
    """Not yet implemented in kolo (docs/spark.md, "Not supported")."""
    raise KoloNotImplementedError("kolo.spark.run_elastic", "use kolo.spark.run with a fixed num_proc, "
                                  "or kolo.ray.ElasticRayExecutor / kolorun's elastic mode for an "
                                  "elastic job; see docs/spark.md")
