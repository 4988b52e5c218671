"""flash3: FlashAttention-3 for NVIDIA Hopper, called from PyTorch (forward, and backward
through autograd for float16/bfloat16, head dims 64 and 128).

A thin ctypes layer over libflash3.so (the C ABI in include/flash3/flash3.h); nothing
is compiled against PyTorch. `import flash3` needs neither PyTorch nor the library:
the library is looked up on first use (see flash3._lib.SEARCH_PATHS and $FLASH3_LIBRARY)
and a missing one raises flash3.LibraryNotFoundError saying how to build or point to it.

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

        return getattr(flash_attn_interface, name)
    if name == "__version__":
        from ._lib import version

        return version()
    raise AttributeError(f"module 'flash3' has no attribute {name!r}")
