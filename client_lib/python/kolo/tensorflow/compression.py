"""Gradient compression (Horovod's horovod/tensorflow/compression.py)."""

import tensorflow as tf

from .._compression import Compressor, NoneCompressor  # noqa: F401 (kolo.*.compression.Compressor)


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their dtype."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tf.cast(tensor, ctx) if ctx is not None and ctx.is_floating else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
