"""kolo.keras: Horovod's horovod.keras on kolo (the same as kolo.tensorflow.keras:
Keras on the TensorFlow backend). See docs/tensorflow.md."""

from ..tensorflow.keras import *  # noqa: F401,F403
from . import callbacks, elastic  # noqa: F401,E402  (kolo.keras.callbacks as a module too)
from ..tensorflow.keras import (  # noqa: F401
    DistributedOptimizer,
    broadcast_global_variables,
    load_model,
)
