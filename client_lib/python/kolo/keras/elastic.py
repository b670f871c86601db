"""kolo.keras.elastic: kolo.tensorflow.keras.elastic under Horovod's horovod.keras name."""

from ..tensorflow.keras.elastic import *  # noqa: F401,F403
from ..tensorflow.keras.elastic import (  # noqa: F401
    CommitStateCallback,
    HostsUpdatedInterrupt,
    TensorFlowKerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
    run,
)
