"""Gradient compression applied in Python around a collective, as in Horovod:
the interface and the identity compressor shared by kolo.torch and
kolo.tensorflow (each adds its FP16Compressor and its ``Compression``)."""


class Compressor:
    """compress(tensor) -> (tensor_to_send, ctx); decompress(tensor, ctx) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor
