"""Gradient compression applied in Python around a collective (as in Horovod).

``Compression.none`` sends tensors as they are; ``Compression.fp16`` casts
floating-point tensors to float16 for the collective and back afterwards
(other dtypes pass through unchanged).
"""

import torch

from .._compression import Compressor, NoneCompressor  # noqa: F401 (kolo.*.compression.Compressor)


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor):
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.float16:
            return tensor.to(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx != tensor.dtype:
            return tensor.to(ctx)
        return tensor


class Compression:
    """The compressors, used as ``hvd.Compression.fp16``."""
    none = NoneCompressor
    fp16 = FP16Compressor
