"""ctypes bindings to libflash3.so: struct mirrors of flash3.h, loading, errors.

No PyTorch here: this module works (and is tested) on machines without it.
"""
import ctypes
import functools
import os
from pathlib import Path

LIBRARY_ENV = "FLASH3_LIBRARY"
LIBRARY_NAME = "libflash3.so"
_PACKAGE_DIR = Path(__file__).resolve().parent
# Searched in order when FLASH3_LIBRARY is not set.
SEARCH_PATHS = (_PACKAGE_DIR / LIBRARY_NAME, _PACKAGE_DIR.parents[1] / "build" / LIBRARY_NAME)

# flash3_status and flash3_dtype values, named as in flash3.h less the FLASH3_ prefix.
OK, ERROR_INVALID_ARGUMENT, ERROR_UNSUPPORTED, ERROR_NO_DEVICE, ERROR_CUDA, ERROR_INTERNAL = range(6)
DTYPE_FLOAT16, DTYPE_BFLOAT16, DTYPE_FLOAT32, DTYPE_FLOAT8_E4M3 = 1, 2, 3, 4


class LibraryNotFoundError(RuntimeError):
    """libflash3.so could not be found or loaded."""


class Tensor(ctypes.Structure):
    """flash3_tensor: (batch, seqlen, heads, headdim), strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),  # flash3_dtype: a C enum, int-sized
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


class ForwardArgs(ctypes.Structure):
    """flash3_forward_args."""

    _fields_ = [
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("out", Tensor),
        ("softmax_lse", ctypes.POINTER(ctypes.c_float)),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("sinks", ctypes.POINTER(ctypes.c_float)),
        ("window", ctypes.c_int),
        ("window_left", ctypes.c_int),
        ("window_right", ctypes.c_int),
        ("attention_chunk", ctypes.c_int),
        ("softcap", ctypes.c_float),
    ]


# The varlen description that follows the call's args in its *_varlen_args.
_VARLEN_FIELDS = [
    ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int)),
    ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int)),
    ("batch", ctypes.c_int),
    ("max_seqlen_q", ctypes.c_int),
    ("seqused_q", ctypes.POINTER(ctypes.c_int)),
    ("seqused_k", ctypes.POINTER(ctypes.c_int)),
]


class ForwardVarlenArgs(ctypes.Structure):
    """flash3_forward_varlen_args."""

    _fields_ = [("forward", ForwardArgs)] + _VARLEN_FIELDS


class ForwardKvCacheArgs(ctypes.Structure):
    """flash3_forward_kvcache_args."""

    _fields_ = [
        ("forward", ForwardArgs),
        ("cache_seqlens", ctypes.POINTER(ctypes.c_int)),
        ("cache_batch_idx", ctypes.POINTER(ctypes.c_int)),
        ("page_table", ctypes.POINTER(ctypes.c_int)),
        ("pages_per_batch", ctypes.c_int),
        ("page_table_rows", ctypes.c_int),
        ("cache_leftpad", ctypes.POINTER(ctypes.c_int)),
    ]


class KvCacheAppendArgs(ctypes.Structure):
    """flash3_kvcache_append_args."""

    _fields_ = [
        ("q", Tensor),
        ("k_cache", Tensor),
        ("v_cache", Tensor),
        ("k_new", Tensor),
        ("v_new", Tensor),
        ("q_rotated", Tensor),
        ("cache_seqlens", ctypes.POINTER(ctypes.c_int)),
        ("cache_batch_idx", ctypes.POINTER(ctypes.c_int)),
        ("page_table", ctypes.POINTER(ctypes.c_int)),
        ("pages_per_batch", ctypes.c_int),
        ("rotary_cos", ctypes.c_void_p),
        ("rotary_sin", ctypes.c_void_p),
        ("rotary_rows", ctypes.c_int),
        ("rotary_dim", ctypes.c_int),
        ("rotary_interleaved", ctypes.c_int),
        ("causal", ctypes.c_int),
        ("seqlens_out", ctypes.POINTER(ctypes.c_int)),
        ("page_table_rows", ctypes.c_int),
        ("rotary_seqlens", ctypes.POINTER(ctypes.c_int)),
    ]


class BackwardArgs(ctypes.Structure):
    """flash3_backward_args."""

    _fields_ = [
        ("dout", Tensor),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("out", Tensor),
        ("softmax_lse", ctypes.POINTER(ctypes.c_float)),
        ("dq", Tensor),
        ("dk", Tensor),
        ("dv", Tensor),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("deterministic", ctypes.c_int),
        ("sinks", ctypes.POINTER(ctypes.c_float)),
        ("dsinks", ctypes.POINTER(ctypes.c_float)),
        ("window", ctypes.c_int),
        ("window_left", ctypes.c_int),
        ("window_right", ctypes.c_int),
        ("attention_chunk", ctypes.c_int),
        ("softcap", ctypes.c_float),
    ]


class BackwardVarlenArgs(ctypes.Structure):
    """flash3_backward_varlen_args."""

    _fields_ = [("backward", BackwardArgs)] + _VARLEN_FIELDS


class Fp8V(ctypes.Structure):
    """flash3_fp8_v: e4m3 V in the FP8 forward's layout (flash3.h)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("seqlen", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("headdim", ctypes.c_int64),
    ]


class Fp8Descale(ctypes.Structure):
    """flash3_fp8_descale."""

    _fields_ = [("data", ctypes.c_void_p), ("block_rows", ctypes.c_int)]


class ForwardFp8Args(ctypes.Structure):
    """flash3_forward_fp8_args."""

    _fields_ = [
        ("q", Tensor),
        ("k", Tensor),
        ("v", Fp8V),
        ("out", Tensor),
        ("softmax_lse", ctypes.POINTER(ctypes.c_float)),
        ("q_descale", Fp8Descale),
        ("k_descale", Fp8Descale),
        ("v_descale", Fp8Descale),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
    ]


class QuantizeArgs(ctypes.Structure):
    """flash3_quantize_args."""

    _fields_ = [
        ("x", Tensor),
        ("x_fp8", Tensor),
        ("descale", ctypes.POINTER(ctypes.c_float)),
        ("block_rows", ctypes.c_int),
        ("hadamard", ctypes.c_int),
        ("seed", ctypes.c_uint64),
    ]


class Fp8VLayoutArgs(ctypes.Structure):
    """flash3_fp8_v_layout_args."""

    _fields_ = [("v", Tensor), ("v_out", Fp8V)]


class CombineArgs(ctypes.Structure):
    """flash3_combine_args: split-KV partial results to merge (strides in elements)."""

    _fields_ = [
        ("out_partial", ctypes.POINTER(ctypes.c_float)),
        ("out_partial_shape", ctypes.c_int64 * 5),
        ("out_partial_stride", ctypes.c_int64 * 5),
        ("lse_partial", ctypes.POINTER(ctypes.c_float)),
        ("lse_partial_stride", ctypes.c_int64 * 4),
        ("out", Tensor),
        ("lse", ctypes.POINTER(ctypes.c_float)),
        ("lse_stride", ctypes.c_int64 * 3),
    ]


FP8_V_KEY_GROUP = 16  # FLASH3_FP8_V_KEY_GROUP
MAX_COMBINE_HEAD_DIM = 1024  # FLASH3_MAX_COMBINE_HEAD_DIM

# The calls that take (const args*, cudaStream_t) and return flash3_status.
_CALLS = {
    "flash3_forward": ForwardArgs,
    "flash3_forward_varlen": ForwardVarlenArgs,
    "flash3_forward_kvcache": ForwardKvCacheArgs,
    "flash3_kvcache_append": KvCacheAppendArgs,
    "flash3_backward": BackwardArgs,
    "flash3_backward_varlen": BackwardVarlenArgs,
    "flash3_forward_fp8": ForwardFp8Args,
    "flash3_quantize_fp8": QuantizeArgs,
    "flash3_fp8_v_layout": Fp8VLayoutArgs,
    "flash3_combine": CombineArgs,
}


# The CUDA version the library is built for (static CUDA runtime 13.0): the driver must
# support it (R580 or newer).
CUDA_DRIVER_NEEDED = 13000


def check_driver():
    """Raises LibraryNotFoundError when an NVIDIA driver is installed but too old for
    flash3's CUDA 13 build. No driver at all is not an error here: every call then says
    that there is no GPU."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value == 0:
        return
    if version.value < CUDA_DRIVER_NEEDED:
        have = f"{version.value // 1000}.{version.value % 1000 // 10}"
        raise LibraryNotFoundError(
            f"flash3: the NVIDIA driver supports CUDA {have}, but flash3 is built with CUDA 13.0 "
            f"and needs a driver for CUDA 13.0 or newer (R580+); update the driver"
        )


def _find_library():
    if LIBRARY_ENV in os.environ:
        path = Path(os.environ[LIBRARY_ENV])
        if not path.is_file():
            raise LibraryNotFoundError(f"flash3: {LIBRARY_ENV}={path} is not a file")
        return path
    for path in SEARCH_PATHS:
        if path.is_file():
            return path
    raise LibraryNotFoundError(
        f"flash3: {LIBRARY_NAME} not found in {', '.join(map(str, SEARCH_PATHS))}. Build it "
        f"(cmake -S . -B build -G Ninja && ninja -C build) or set {LIBRARY_ENV} to its path."
    )


@functools.cache
def library():
    """The loaded libflash3.so, with argument and return types declared."""
    check_driver()
    path = _find_library()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise LibraryNotFoundError(f"flash3: cannot load {path}: {e}") from e
    for name, args_type in _CALLS.items():
        getattr(lib, name).argtypes = [ctypes.POINTER(args_type), ctypes.c_void_p]
        getattr(lib, name).restype = ctypes.c_int
    lib.flash3_backward_workspace_size.argtypes = [
        ctypes.POINTER(BackwardArgs),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    lib.flash3_backward_workspace_size.restype = ctypes.c_int
    lib.flash3_backward_varlen_workspace_size.argtypes = [
        ctypes.POINTER(BackwardVarlenArgs),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    lib.flash3_backward_varlen_workspace_size.restype = ctypes.c_int
    lib.flash3_forward_workspace_size.argtypes = [ctypes.POINTER(Tensor), ctypes.POINTER(ctypes.c_size_t)]
    lib.flash3_forward_workspace_size.restype = ctypes.c_int
    for name in ("flash3_last_error", "flash3_version"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = ctypes.c_char_p
    return lib


def version():
    return library().flash3_version().decode()


# FLASH3_ERROR_UNSUPPORTED -> NotImplementedError (a RuntimeError, as FlashAttention's
# errors are); a bad argument -> ValueError; device, CUDA and internal errors -> RuntimeError.
_ERRORS = {ERROR_INVALID_ARGUMENT: ValueError, ERROR_UNSUPPORTED: NotImplementedError}


def _check(lib, status):
    """Raises with flash3_last_error() unless status is FLASH3_OK."""
    if status != OK:
        raise _ERRORS.get(status, RuntimeError)(lib.flash3_last_error().decode())


def _call(name, args, stream):
    """flash3_<call>(&args, stream); raises with flash3_last_error() unless FLASH3_OK."""
    lib = library()
    _check(lib, getattr(lib, name)(ctypes.byref(args), ctypes.c_void_p(stream)))


def forward(args, stream):
    _call("flash3_forward", args, stream)


def backward(args, stream):
    _call("flash3_backward", args, stream)


def backward_workspace_size(args):
    """flash3_backward_workspace_size: the bytes of device scratch flash3_backward needs
    for args' shapes and args.deterministic (args.workspace ignored). Needs no GPU."""
    lib = library()
    size = ctypes.c_size_t(0)
    _check(lib, lib.flash3_backward_workspace_size(ctypes.byref(args), ctypes.byref(size)))
    return size.value


def forward_workspace_size(q):
    """flash3_forward_workspace_size: the bytes of device scratch a forward may use for
    q's head dim (a flash3_tensor; only its dtype and head dim are read). Needs no GPU."""
    lib = library()
    size = ctypes.c_size_t(0)
    _check(lib, lib.flash3_forward_workspace_size(ctypes.byref(q), ctypes.byref(size)))
    return size.value


def forward_fp8(args, stream):
    _call("flash3_forward_fp8", args, stream)


def quantize_fp8(args, stream):
    _call("flash3_quantize_fp8", args, stream)


def fp8_v_layout(args, stream):
    _call("flash3_fp8_v_layout", args, stream)


def combine(args, stream):
    _call("flash3_combine", args, stream)
