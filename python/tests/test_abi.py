"""The ctypes layer against flash3.h and libflash3.so; needs neither PyTorch nor a GPU."""
import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flash3 import _lib

INCLUDE_DIR = Path(__file__).resolve().parents[2] / "include"

# Every ctypes mirror of a flash3.h struct.
STRUCTS = (
    (_lib.Tensor, "flash3_tensor"),
    (_lib.ForwardArgs, "flash3_forward_args"),
    (_lib.ForwardVarlenArgs, "flash3_forward_varlen_args"),
    (_lib.ForwardKvCacheArgs, "flash3_forward_kvcache_args"),
    (_lib.KvCacheAppendArgs, "flash3_kvcache_append_args"),
    (_lib.BackwardArgs, "flash3_backward_args"),
    (_lib.BackwardVarlenArgs, "flash3_backward_varlen_args"),
    (_lib.Fp8V, "flash3_fp8_v"),
    (_lib.Fp8Descale, "flash3_fp8_descale"),
    (_lib.ForwardFp8Args, "flash3_forward_fp8_args"),
    (_lib.QuantizeArgs, "flash3_quantize_args"),
    (_lib.Fp8VLayoutArgs, "flash3_fp8_v_layout_args"),
    (_lib.CombineArgs, "flash3_combine_args"),
)


def _c_layout(tmp_path):
    """{name: value} of sizeof, offsetof and enum values, printed by a C program built on flash3.h."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc)")
    # flash3.h needs only cudaStream_t from the CUDA headers: a stub keeps CUDA out of this test.
    (tmp_path / "cuda_runtime_api.h").write_text("typedef struct CUstream_st* cudaStream_t;\n")
    lines = [f'printf("FP8_V_KEY_GROUP %d\\n", (int)FLASH3_FP8_V_KEY_GROUP);']
    lines.append('printf("MAX_COMBINE_HEAD_DIM %d\\n", (int)FLASH3_MAX_COMBINE_HEAD_DIM);')
    for struct, c_name in STRUCTS:
        lines.append(f'printf("sizeof {c_name} %zu\\n", sizeof({c_name}));')
        for field, _ in struct._fields_:
            lines.append(f'printf("{c_name}.{field} %zu\\n", offsetof({c_name}, {field}));')
    for name in _constant_names():
        lines.append(f'printf("{name} %d\\n", (int)FLASH3_{name});')
    source = tmp_path / "layout.c"
    source.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"flash3/flash3.h\"\n"
        "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n"
    )
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", str(tmp_path), "-I", str(INCLUDE_DIR), str(source), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.rsplit(" ", 1) for line in out.splitlines())}


def _constant_names():
    return [n for n in dir(_lib) if n == "OK" or n.startswith(("ERROR_", "DTYPE_"))]


def test_ctypes_mirrors_match_the_header(tmp_path):
    c = _c_layout(tmp_path)
    for struct, c_name in STRUCTS:
        assert ctypes.sizeof(struct) == c[f"sizeof {c_name}"]
        for field, _ in struct._fields_:
            assert getattr(struct, field).offset == c[f"{c_name}.{field}"], field
    for name in _constant_names():
        assert getattr(_lib, name) == c[name], name
    assert _lib.FP8_V_KEY_GROUP == c["FP8_V_KEY_GROUP"]
    assert _lib.MAX_COMBINE_HEAD_DIM == c["MAX_COMBINE_HEAD_DIM"]


def test_import_needs_no_library(tmp_path):
    env = {"FLASH3_LIBRARY": str(tmp_path / "missing.so"), "PYTHONPATH": str(INCLUDE_DIR.parent / "python")}
    subprocess.run([sys.executable, "-c", "import flash3, flash3._lib"], check=True, env=env)


def test_missing_library_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASH3_LIBRARY", str(tmp_path / "missing.so"))
    _lib.library.cache_clear()
    try:
        with pytest.raises(_lib.LibraryNotFoundError, match="FLASH3_LIBRARY=.*missing.so is not a file"):
            _lib.version()
    finally:
        _lib.library.cache_clear()


@pytest.fixture
def lib():
    try:
        return _lib.library()
    except _lib.LibraryNotFoundError as e:
        pytest.skip(str(e))


def test_version(lib):
    assert re.fullmatch(r"\d+\.\d+\.\d+", _lib.version())


def _valid_args():
    """Arguments that pass validation; the fake pointers fail only at the device check."""
    shape = (2, 256, 8, 128)
    stride = (256 * 8 * 128, 8 * 128, 128, 1)
    tensors = [_lib.Tensor(base << 32, _lib.DTYPE_BFLOAT16, shape, stride) for base in (1, 2, 3, 4)]
    return _lib.ForwardArgs(*tensors, None, 0.0, 1)


# Each case breaks one field; the library must name that very field, which shows that
# the struct reaches it at the right offset. Validation runs before any device call.
@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("q.data", None, ValueError, r"q\.data is null"),
        ("k.shape", (2, 256, 8, 64), ValueError, r"k\.shape\[3\] \(headdim\) = 64 differs"),
        ("v.stride", (256 * 8 * 128, 8 * 128, 128, 2), ValueError, r"v\.stride\[3\] \(headdim\) = 2"),
        ("out.dtype", _lib.DTYPE_FLOAT32, ValueError, r"out\.dtype is float32"),
        ("softmax_lse", ctypes.cast(2, ctypes.POINTER(ctypes.c_float)), ValueError, "softmax_lse is not 4-byte aligned"),
        ("softmax_scale", -1.0, ValueError, r"softmax_scale = -1"),
        ("q.dtype", _lib.DTYPE_FLOAT8_E4M3, NotImplementedError, "float8_e4m3"),
    ],
)
def test_library_names_the_bad_field(lib, field, value, error, message):
    args = _valid_args()
    *path, last = field.split(".")
    target = getattr(args, path[0]) if path else args
    setattr(target, last, value)
    with pytest.raises(error, match=message):
        _lib.forward(args, 0)


# ---------------------------------------------------------------- backward

Q_SHAPE, K_SHAPE = (2, 256, 8, 128), (2, 512, 2, 128)  # GQA


def _tensor(slot, shape, dtype=_lib.DTYPE_BFLOAT16):
    """A contiguous flash3_tensor at a fake address, 4 GiB from the next slot's."""
    stride = (shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1)
    return _lib.Tensor(slot << 32, dtype, shape, stride)


def _valid_backward_args(k_shape=K_SHAPE, seqlen_q=Q_SHAPE[1]):
    """A backward that passes validation; the fake pointers fail only at the device check."""
    q_shape = (Q_SHAPE[0], seqlen_q, *Q_SHAPE[2:])
    return _lib.BackwardArgs(
        _tensor(1, q_shape),  # dout
        _tensor(2, q_shape),  # q
        _tensor(3, k_shape),  # k
        _tensor(4, k_shape),  # v
        _tensor(5, q_shape),  # out
        ctypes.cast(6 << 32, ctypes.POINTER(ctypes.c_float)),  # softmax_lse
        _tensor(7, q_shape),  # dq
        _tensor(8, k_shape),  # dk
        _tensor(9, k_shape),  # dv
        None,  # workspace: flash3's own
        0,
        0.0,
        1,
        0,
    )


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("dout.data", None, ValueError, r"flash3::backward: dout\.data is null"),
        ("dk.shape", (2, 512, 2, 64), ValueError,
         r"dk\.shape \(2, 512, 2, 64\) differs from k\.shape \(2, 512, 2, 128\)"),
        ("dv.stride", (512 * 2 * 128, 2 * 128, 128, 2), ValueError, r"dv\.stride\[3\] \(headdim\) = 2"),
        ("out.dtype", _lib.DTYPE_FLOAT32, ValueError, r"out\.dtype is float32"),
        ("softmax_lse", None, ValueError, "softmax_lse is null"),
        ("dq.dtype", _lib.DTYPE_FLOAT8_E4M3, NotImplementedError, "the backward has no FP8 path"),
        ("softmax_scale", -1.0, ValueError, r"softmax_scale = -1"),
        ("workspace", (10 << 32) + 128, ValueError, r"options\.workspace is not 256-byte aligned"),
    ],
)
def test_backward_names_the_bad_field(lib, field, value, error, message):
    args = _valid_backward_args()
    *path, last = field.split(".")
    target = getattr(args, path[0]) if path else args
    setattr(target, last, value)
    if field == "workspace":
        args.workspace_bytes = 1 << 30
    with pytest.raises(error, match=message):
        _lib.backward(args, 0)


def test_backward_workspace_bytes_reach_the_library(lib):
    args = _valid_backward_args()
    needed = _lib.backward_workspace_size(args)
    args.workspace = 10 << 32
    args.workspace_bytes = needed - 256
    message = rf"options\.workspace_bytes = {needed - 256} is less than the {needed} bytes"
    with pytest.raises(ValueError, match=message):
        _lib.backward(args, 0)


def test_valid_backward_stops_at_the_device(lib):
    # Without a GPU: no device; with one: the fake pointers are not device memory.
    with pytest.raises((RuntimeError, ValueError), match=r"no usable CUDA device|dout\.data is not device memory"):
        _lib.backward(_valid_backward_args(), 0)


def test_backward_workspace_size_needs_no_device(lib):
    size = _lib.backward_workspace_size(_valid_backward_args())
    assert isinstance(size, int) and size > 0 and size % 256 == 0
    # At least the fp32 dQ accumulator: batch * heads_q * seqlen_q * headdim floats.
    assert size >= 2 * 8 * 256 * 128 * 4


def test_forward_workspace_size_needs_no_device(lib):
    sizes = [_lib.forward_workspace_size(_tensor(1, (2, 1000, 8, d))) for d in (64, 128, 256)]
    assert all(size % 256 == 0 for size in sizes) and sizes == sorted(set(sizes))
    # Each of up to 144 CTAs: at least a 128-row fp32 tile of O.
    assert sizes[1] >= 144 * 128 * 128 * 4
    with pytest.raises(NotImplementedError, match="headdim = 80"):
        _lib.forward_workspace_size(_tensor(1, (2, 1000, 8, 80)))


def test_backward_workspace_size_grows_linearly_with_seqlen(lib):
    sizes = [_lib.backward_workspace_size(_valid_backward_args(seqlen_q=s)) for s in (1024, 2048, 4096)]
    assert sizes[1] - sizes[0] > 0
    assert sizes[2] - sizes[1] == 2 * (sizes[1] - sizes[0])  # linear, not quadratic


def test_backward_workspace_size_reads_deterministic_and_heads(lib):
    args = _valid_backward_args()
    plain = _lib.backward_workspace_size(args)
    args.deterministic = 1
    assert _lib.backward_workspace_size(args) > plain  # semaphores
    mha = _lib.backward_workspace_size(_valid_backward_args(k_shape=(2, 512, 8, 128)))
    assert plain > mha  # GQA: fp32 dK/dV accumulators


def test_backward_workspace_size_names_the_bad_field(lib):
    args = _valid_backward_args()
    args.k.shape[3] = 64
    message = r"flash3::backward_workspace_size: k\.shape\[3\] \(headdim\) = 64 differs"
    with pytest.raises(ValueError, match=message):
        _lib.backward_workspace_size(args)


def test_backward_null_args_are_refused(lib):
    assert lib.flash3_backward(None, None) == _lib.ERROR_INVALID_ARGUMENT
    assert b"flash3_backward: args is null" in lib.flash3_last_error()
    size = ctypes.c_size_t(12345)
    assert lib.flash3_backward_workspace_size(None, ctypes.byref(size)) == _lib.ERROR_INVALID_ARGUMENT
    assert b"flash3_backward_workspace_size: args is null" in lib.flash3_last_error()
    assert size.value == 12345
    args = _valid_backward_args()
    assert lib.flash3_backward_workspace_size(ctypes.byref(args), None) == _lib.ERROR_INVALID_ARGUMENT
    assert b"bytes is null" in lib.flash3_last_error()


# ---------------------------------------------------------------- combine

def _valid_combine_args():
    """A combine that passes validation: 3 splits of batch 2, seqlen 5, heads 4, headdim 64 in
    FlashAttention-3's layouts (lse_partial seqlen-contiguous, lse (batch, heads, seqlen)
    transposed), bfloat16 out; the fake pointers fail only at the device check."""
    n, b, s, h, d = 3, 2, 5, 4, 64
    at = lambda slot: ctypes.cast(slot << 32, ctypes.POINTER(ctypes.c_float))
    out = _lib.Tensor(3 << 32, _lib.DTYPE_BFLOAT16, (b, s, h, d), (s * h * d, h * d, d, 1))
    return _lib.CombineArgs(at(1), (n, b, s, h, d), (b * s * h * d, s * h * d, h * d, d, 1),
                            at(2), (b * s * h, s * h, 1, s), out, at(4), (h * s, 1, s))


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("out_partial", None, ValueError, r"flash3::combine: out_partial is null"),
        ("out_partial_shape", (0, 2, 5, 4, 64), ValueError,
         r"out_partial_shape\[0\] \(num_splits\) = 0 must be at least 1"),
        ("out_partial_stride", (2560, 1280, 256, 64, 2), ValueError,
         r"out_partial_stride\[4\] \(headdim\) = 2 must be 1"),
        ("lse_partial", None, ValueError, "lse_partial is null"),
        ("lse_partial_stride", (40, 20, -1, 5), ValueError,
         r"lse_partial_stride\[2\] \(seqlen\) = -1 must not be negative"),
        ("out.shape", (2, 5, 4, 32), ValueError, r"out\.shape \(2, 5, 4, 32\) differs from out_partial_shape"),
        ("out.dtype", _lib.DTYPE_FLOAT8_E4M3, ValueError, "out.dtype is float8_e4m3"),
        ("lse", ctypes.cast((4 << 32) + 2, ctypes.POINTER(ctypes.c_float)), ValueError,
         "lse is not 4-byte aligned"),
        ("lse_stride", (20, 1, 0), ValueError, "lse's strides make elements overlap"),
    ],
)
def test_combine_names_the_bad_field(lib, field, value, error, message):
    args = _valid_combine_args()
    *path, last = field.split(".")
    target = getattr(args, path[0]) if path else args
    setattr(target, last, value)
    with pytest.raises(error, match=message):
        _lib.combine(args, 0)


def test_valid_combine_stops_at_the_device(lib):
    with pytest.raises((RuntimeError, ValueError), match=r"no usable CUDA device|out_partial is not device memory"):
        _lib.combine(_valid_combine_args(), 0)
    assert lib.flash3_combine(None, None) == _lib.ERROR_INVALID_ARGUMENT
    assert b"flash3_combine: args is null" in lib.flash3_last_error()
