"""kolo.keras.callbacks: kolo.tensorflow.keras.callbacks under Horovod's horovod.keras name."""

from ..tensorflow.keras.callbacks import *  # noqa: F401,F403
