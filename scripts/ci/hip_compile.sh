#!/usr/bin/env bash
# Compile check of the HIP backend in CI (no AMD GPU there, nothing is run): installs Debian's hipcc when it
# is missing, then configures engines/ with LUCEBENCH_BACKEND=hip and builds lucebench-ar,
# lucebench-megakernel and lucebench-dflash (core library and the GPU draft: GPU kernels for one wave32 gfx
# target, link against libamdhip64) in a fresh folder. Fails when any step fails.
#
#   HIP_ARCH=gfx1030           the gfx target (Debian 12's hipcc 5.2.3 with clang 15: gfx1030 and the other
#                              gfx103x, gfx90a, gfx908...; not gfx1100/gfx1151, see docs/engines.md)
#   LUCEBENCH_BUILD_JOBS=N     parallel compile jobs (default: all cores)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ARCH="${HIP_ARCH:-gfx1030}"
JOBS="${LUCEBENCH_BUILD_JOBS:-$(nproc)}"
BUILD="${TMPDIR:-/tmp}/lucebench-ci-hip-$ARCH"
start=$(date +%s)

if ! command -v hipcc >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends hipcc
  echo "hipcc installed in $(( $(date +%s) - start )) s"
fi
# hipcc picks the NVIDIA platform when nvcc is on PATH (as in CI); the hip backend is AMD's.
export HIP_PLATFORM=amd
echo "$(command -v hipcc): $(hipcc --version | head -n 1), target $ARCH, $JOBS jobs"

rm -rf "$BUILD"
t0=$(date +%s)
cmake -S "$ROOT/engines" -B "$BUILD" -DLUCEBENCH_BACKEND=hip -DCMAKE_BUILD_TYPE=Release -DCMAKE_HIP_ARCHITECTURES="$ARCH"
cmake --build "$BUILD" -j "$JOBS" --target lucebench-ar lucebench-megakernel lucebench-dflash
test -x "$BUILD/lucebench-ar"
test -x "$BUILD/lucebench-dflash"
test -x "$BUILD/lucebench-megakernel"
rm -rf "$BUILD"
echo "hip compile check ($ARCH): configure + build $(( $(date +%s) - t0 )) s, step $(( $(date +%s) - start )) s wall"
