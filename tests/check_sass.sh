#!/usr/bin/env bash
# SASS check of the built forward kernels, no GPU needed (ctest: SassForwardKernels):
# every forward kernel issues warpgroup MMAs (HGMMA/QGMMA), and ptxas did not
# serialize them. ptxas serializes every wgmma of a kernel when it cannot prove
# the overlap safe (info C7513/C7514, printed as build info, not as warnings):
# each GMMA is then followed by its own WARPGROUP.DEPBAR, where our kernels wait
# a handful of times per loop (4 per kernel today against 16-42 GMMAs).
#   tests/check_sass.sh LIBRARY TOOLS_DIR      exit 0 ok, 1 failed, 77 skipped
set -uo pipefail
lib="$1" tools="$2"
cuobjdump="$(command -v cuobjdump || true)"
[[ -x "$tools/cuobjdump" ]] && cuobjdump="$tools/cuobjdump"
if [[ -z "$cuobjdump" ]]; then
  echo "SKIP: no cuobjdump (scripts/fetch-sass-tools installs it)"
  exit 77
fi
export PATH="$tools:$PATH" # cuobjdump runs nvdisasm
sass="$(mktemp)"
trap 'rm -f "$sass"' EXIT
"$cuobjdump" --dump-sass "$lib" >"$sass" 2>&1 || { echo "cuobjdump failed:"; tail -5 "$sass"; exit 1; }
awk '
  /Function :/ { name = $3; if (name ~ /forward_kernel/) { kernels[name] = 1 } }
  /[HQ]GMMA/ { gmma[name]++ }
  /WARPGROUP.DEPBAR/ { depbar[name]++ }
  END {
    n = 0; bad = 0
    for (k in kernels) {
      n++
      status = "ok"
      if (gmma[k] == 0) { status = "FAIL: no warpgroup MMA"; bad++ }
      else if (2 * depbar[k] > gmma[k]) { status = "FAIL: wgmma serialized (ptxas C7513/C7514?)"; bad++ }
      printf "%4d GMMA %4d DEPBAR  %s  %s\n", gmma[k], depbar[k], status, k
    }
    if (n == 0) { print "SKIP: no forward kernel in this build"; exit 77 }
    printf "%d forward kernels, %d failed\n", n, bad
    exit bad > 0 ? 1 : 0
  }' "$sass"
