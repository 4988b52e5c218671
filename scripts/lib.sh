# Shared by scripts/*: sourced, not run. Paths, logging, tool discovery.
# shellcheck shell=bash disable=SC2034  # (variables used by the sourcing scripts)

FLASH3_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The build directory every script shares; override with FLASH3_BUILD_DIR.
BUILD_DIR="${FLASH3_BUILD_DIR:-$FLASH3_ROOT/build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$FLASH3_ROOT/$BUILD_DIR" ;; esac

# Exit codes shared by the scripts (README.md, "Scripts").
readonly EXIT_OK=0
readonly EXIT_FAILED=1
readonly EXIT_USAGE=2
readonly EXIT_NO_HOPPER=3

if [[ -t 1 ]]; then
  _bold=$'\033[1m' _yellow=$'\033[1;33m' _red=$'\033[1;31m' _plain=$'\033[0m'
else
  _bold="" _yellow="" _red="" _plain=""
fi
log() { printf '%s[%s]%s %s\n' "$_bold" "${LOG_NAME:-$(basename "$0")}" "$_plain" "$*"; }
warn() { printf '%s[%s] warning:%s %s\n' "$_yellow" "${LOG_NAME:-$(basename "$0")}" "$_plain" "$*" >&2; }
die() {
  printf '%s[%s] error:%s %s\n' "$_red" "${LOG_NAME:-$(basename "$0")}" "$_plain" "$*" >&2
  exit "$EXIT_FAILED"
}

# The script's header comment, as its --help.
usage() { sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; }

ncpus() { nproc 2>/dev/null || echo 2; }

# The CUDA compiler: $CUDACXX, nvcc on PATH, or the usual install places.
# Puts its directory (and so cuobjdump, compute-sanitizer) on PATH.
find_nvcc() {
  local nvcc="${CUDACXX:-}"
  if [[ -z "$nvcc" ]]; then
    nvcc="$(command -v nvcc || true)"
  fi
  if [[ -z "$nvcc" ]]; then
    local dir
    for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13.0 /opt/cuda; do
      if [[ -n "$dir" && -x "$dir/bin/nvcc" ]]; then
        nvcc="$dir/bin/nvcc"
        break
      fi
    done
  fi
  [[ -n "$nvcc" && -x "$nvcc" ]] || return 1
  local bin
  bin="$(dirname "$nvcc")"
  case ":$PATH:" in *":$bin:"*) ;; *) PATH="$bin:$PATH" ;; esac
  if [[ -d "$bin/../compute-sanitizer" ]]; then
    PATH="$PATH:$(cd "$bin/../compute-sanitizer" && pwd)"
  fi
  export PATH
  echo "$nvcc"
}

# Compute capabilities of the visible GPUs, one "major.minor" a line (none:
# nothing). nvidia-smi if present, else a ctypes probe of the driver.
gpu_compute_caps() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' ' && return
  fi
  command -v python3 >/dev/null 2>&1 || return 0
  python3 - <<'PY' 2>/dev/null || true
import ctypes
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError:
    raise SystemExit(0)
if cuda.cuInit(0) != 0:
    raise SystemExit(0)
count = ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(count))
for i in range(count.value):
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
    print(f"{major.value}.{minor.value}")
PY
}

# True when a Hopper GPU (compute capability 9.0) is visible.
have_hopper() { gpu_compute_caps | grep -qx '9\.0'; }

# The library file in $BUILD_DIR (the real file, not a symlink).
flash3_library() {
  local f
  for f in "$BUILD_DIR"/libflash3.so.*.*.* "$BUILD_DIR"/libflash3.so.0 "$BUILD_DIR"/libflash3.so; do
    if [[ -f "$f" ]]; then
      echo "$f"
      return 0
    fi
  done
  return 1
}

python_has() { python3 -c "import $1" >/dev/null 2>&1; }

# pip install into the user's environment (or the active virtualenv), also on
# Debian's externally-managed system python.
pip_install_user() {
  local user_flag="--user"
  if python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    user_flag=""  # inside a virtualenv
  fi
  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet \
    --disable-pip-version-check --no-warn-script-location \
    $user_flag "$@"
}

# Seconds since the epoch, and a duration formatter.
now() { date +%s; }
fmt_duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# Arguments for build/bench/flash3_bench and bench/compare.py (they share
# these flags): the full grid, or with "quick" a subset (bf16, seqlen 1k and
# 8k) for a fast look. Adds the commit if known.
flash3_bench_args() {
  local commit
  [[ "${1:-}" != quick ]] || printf '%s\n' --dtype bf16 --seqlen 1024,8192
  # FLASH3_COMMIT names the commit of a copied tree (the GPU machine), whose
  # .git, if any, need not be the build's (one was seen at an older commit).
  if [[ -n "${FLASH3_COMMIT:-}" ]]; then
    commit="$FLASH3_COMMIT"
  elif commit="$(git -C "$FLASH3_ROOT" rev-parse --short HEAD 2>/dev/null)"; then
    commit="$commit$(git -C "$FLASH3_ROOT" diff --quiet HEAD 2>/dev/null || echo +dirty)"
  fi
  [[ -z "$commit" ]] || printf '%s\n' --commit "$commit"
  return 0
}

# The same for the FP8 benchmark (flash3_bench --dtype fp8: head dims 128 and 256).
flash3_fp8_bench_args() {
  flash3_bench_args "$@" | sed '/^--dtype$/,+1d'
  printf '%s\n' --dtype fp8 --headdim 128,256
}

# bench/fp8_accuracy.py's shape in scripts/run and scripts/gpu-check.
FP8_ACCURACY_ARGS=(--seqlen 8192 --heads 4)

