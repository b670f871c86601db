"""kolo.torch's process sets: the framework-independent kolo.process_sets
(shared with kolo.tensorflow), under its old name."""

import sys

from .. import process_sets as _shared_module

sys.modules[__name__] = _shared_module
