"""torch dtype <-> kolo_dtype_t, and tensor argument checks."""

import torch

# kolo_dtype_t values (client_lib/include/kolo/kolo_c.h).
KOLO_FLOAT16 = 0
KOLO_BFLOAT16 = 1
KOLO_FLOAT32 = 2
KOLO_FLOAT64 = 3
KOLO_INT8 = 4
KOLO_UINT8 = 5
KOLO_INT32 = 6
KOLO_INT64 = 7

TORCH_TO_KOLO = {
    torch.float16: KOLO_FLOAT16,
    torch.bfloat16: KOLO_BFLOAT16,
    torch.float32: KOLO_FLOAT32,
    torch.float64: KOLO_FLOAT64,
    torch.int8: KOLO_INT8,
    torch.uint8: KOLO_UINT8,
    torch.int32: KOLO_INT32,
    torch.int64: KOLO_INT64,
}
KOLO_TO_TORCH = {v: k for k, v in TORCH_TO_KOLO.items()}

SUPPORTED = ", ".join(str(d).replace("torch.", "") for d in TORCH_TO_KOLO)


def kolo_dtype(dtype, op_name):
    try:
        return TORCH_TO_KOLO[dtype]
    except KeyError:
        raise ValueError("kolo %s does not support dtype %s (supported: %s)"
                         % (op_name, str(dtype).replace("torch.", ""), SUPPORTED))


def check_tensor(tensor, op_name, any_dtype=False):
    """Validates a tensor argument; returns its kolo dtype code (None with any_dtype)."""
    if not torch.is_tensor(tensor):
        raise ValueError("kolo %s expects a torch.Tensor, got %s" % (op_name, type(tensor).__name__))
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError("kolo %s supports CPU and CUDA tensors; got a tensor on %s "
                         "(move it with .cpu() or .cuda())" % (op_name, tensor.device))
    if tensor.layout != torch.strided:
        raise ValueError("kolo %s expects a dense tensor, got layout %s (sparse gradients go "
                         "through sparse_allreduce_async or sparse_as_dense=True)"
                         % (op_name, tensor.layout))
    if any_dtype:
        return None
    return kolo_dtype(tensor.dtype, op_name)
