"""Loads flash3's PyTorch operators (_flash3_ops.so, python/csrc/ops.cpp) into torch.ops.flash3.

Looked for beside this package (an installed flash3), beside $FLASH3_LIBRARY (a build
directory the scripts point to), then in the repository's build/ (a development
checkout); $FLASH3_OPS_LIBRARY names another file. Its RPATH finds libflash3.so beside it. Loaded once, at import, so that code compiled with torch.compile
sees only the operator calls.
"""
import os
from pathlib import Path

import torch

from ._lib import LibraryNotFoundError, check_driver

OPS_ENV = "FLASH3_OPS_LIBRARY"
OPS_NAME = "_flash3_ops.so"
_PACKAGE_DIR = Path(__file__).resolve().parent
SEARCH_PATHS = (_PACKAGE_DIR / OPS_NAME, _PACKAGE_DIR.parents[1] / "build" / OPS_NAME)


def _find():
    if OPS_ENV in os.environ:
        path = Path(os.environ[OPS_ENV])
        if not path.is_file():
            raise LibraryNotFoundError(f"flash3: {OPS_ENV}={path} is not a file")
        return path
    beside_library = (Path(os.environ["FLASH3_LIBRARY"]).parent / OPS_NAME,) if "FLASH3_LIBRARY" in os.environ else ()
    candidates = (SEARCH_PATHS[0], *beside_library, *SEARCH_PATHS[1:])
    for path in candidates:
        if path.is_file():
            return path
    raise LibraryNotFoundError(
        f"flash3: the PyTorch operators ({OPS_NAME}) are not in {', '.join(map(str, candidates))}. "
        f"Install the package (pip install --no-build-isolation .) or build them "
        f"(cmake -S . -B build -G Ninja with PyTorch importable by python3, then ninja -C build), "
        f"or set {OPS_ENV} to the file."
    )


def _load():
    if not hasattr(torch.ops.flash3, "fwd"):
        check_driver()
        path = _find()
        try:
            torch.ops.load_library(str(path))
        except OSError as e:
            raise LibraryNotFoundError(
                f"flash3: cannot load {path} into torch {torch.__version__}: {e}. It must be built "
                f"against this PyTorch (rebuild it, or reinstall flash3 with this torch present)."
            ) from e
    return torch.ops.flash3


ops = _load()
