"""kolo on Ray: Horovod's horovod.ray API (docs/ray.md).

``RayExecutor`` runs a function on N ranks placed as Ray actors, with one
kolo-agent per Ray node and a private kolo-coordinator started by the
executor. Worker functions use ``kolo.torch`` as they would ``horovod.torch``.
"""

from .executor import KoloRayError, RayExecutor, RaySettings  # noqa: F401
from ..errors import KoloNotImplementedError


class ElasticRayExecutor:
    """Not yet implemented in kolo (docs/ray.md, "Not supported")."""

    def __init__(self, *args, **kwargs):
        raise KoloNotImplementedError(
            "kolo.ray.ElasticRayExecutor", "use RayExecutor with a fixed number of workers, or "
            "kolorun's elastic mode (docs/elastic.md); see docs/ray.md")

    @classmethod
    def create_settings(cls, *args, **kwargs):
        raise KoloNotImplementedError("kolo.ray.ElasticRayExecutor", "see docs/ray.md")
