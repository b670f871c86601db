"""kolo on Ray: Horovod's horovod.ray API (docs/ray.md).

``RayExecutor`` runs a function on N ranks placed as Ray actors, with one
kolo-agent per Ray node and a private kolo-coordinator started by the
executor. ``ElasticRayExecutor`` runs an elastic function (kolo.torch.elastic)
on the Ray cluster's nodes as they come and go, between min_np and max_np
workers. Worker functions use ``kolo.torch`` as they would ``horovod.torch``.
"""

from .elastic import ElasticRayExecutor, ElasticRaySettings  # noqa: F401
from .executor import KoloRayError, RayExecutor, RaySettings  # noqa: F401
