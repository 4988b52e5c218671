"""flash3: FlashAttention-3 for NVIDIA Hopper, called from PyTorch.

flash3.flash_attn_interface has FlashAttention-3's Python interface (flash_attn_func,
flash_attn_qkvpacked_func, ...) over flash3's registered PyTorch operators
(torch.ops.flash3.*: autograd, torch.compile, CUDA graphs); flash3._lib is a ctypes
binding of the C ABI (include/flash3/flash3.h) that needs no PyTorch. `import flash3`
loads neither: the operators load on first use of flash_attn_func / flash_attn_fp8_func
(or on importing flash3.flash_attn_interface), and a missing library raises
flash3.LibraryNotFoundError saying how to build or install it. docs/python.md has what
is supported.

    from flash3 import flash_attn_func   # or: from flash3.flash_attn_interface import ...
    out = flash_attn_func(q, k, v, causal=True)
    out.sum().backward()   # dq, dk, dv; flash_attn_func(..., deterministic=True) for bitwise repeats
"""
from ._lib import LibraryNotFoundError

__all__ = ["flash_attn_func", "flash_attn_fp8_func", "LibraryNotFoundError", "__version__"]


def __getattr__(name):
    # Lazy, so that importing the package loads neither torch nor libflash3.so.
    if name in ("flash_attn_func", "flash_attn_fp8_func"):
        from . import flash_attn_interface

        value = getattr(flash_attn_interface, name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name == "__version__":
        from ._lib import version

        return version()
    raise AttributeError(f"module 'flash3' has no attribute {name!r}")
