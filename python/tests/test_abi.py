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
    (_lib.Fp8V, "flash3_fp8_v"),
    (_lib.Fp8Descale, "flash3_fp8_descale"),
    (_lib.ForwardFp8Args, "flash3_forward_fp8_args"),
    (_lib.QuantizeArgs, "flash3_quantize_args"),
    (_lib.Fp8VLayoutArgs, "flash3_fp8_v_layout_args"),
)


def _c_layout(tmp_path):
    """{name: value} of sizeof, offsetof and enum values, printed by a C program built on flash3.h."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc)")
    # flash3.h needs only cudaStream_t from the CUDA headers: a stub keeps CUDA out of this test.
    (tmp_path / "cuda_runtime_api.h").write_text("typedef struct CUstream_st* cudaStream_t;\n")
    lines = [f'printf("FP8_V_KEY_GROUP %d\\n", (int)FLASH3_FP8_V_KEY_GROUP);']
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
