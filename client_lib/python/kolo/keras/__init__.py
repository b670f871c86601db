"""kolo.keras: Horovod's horovod.keras on kolo (the same as kolo.tensorflow.keras:
Keras on the TensorFlow backend). See docs/tensorflow.md."""

from ..tensorflow.keras import *  # noqa: F401,F403
from ..tensorflow.keras import (  # noqa: F401
    DistributedOptimizer,
    broadcast_global_variables,
    callbacks,
    load_model,
)
