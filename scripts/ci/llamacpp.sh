#!/usr/bin/env bash
# The llama.cpp baseline in CI: one CPU build per CI run (or none, when the cache already holds it).
#
#   scripts/ci/llamacpp.sh key     print a cache key for $LUCEBENCH_CACHE/llamacpp (pinned commit, sdist sha256,
#                                  compiler, CPU ISA flags: a -march=native build is only reused on a like CPU)
#   scripts/ci/llamacpp.sh build   fetch the pinned source if absent (pip download of the llama-cpp-python sdist)
#                                  and build llama-bench / llama-server / llama-quantize for the CPU; prints the
#                                  build folder and the seconds it took (0 when cached)
#   scripts/ci/llamacpp.sh test    the llama.cpp tests (unit + end to end; they reuse the cached build)
#
# Every step must see the same LUCEBENCH_CACHE (default: .cache/lucebench in the repository), so the build made
# by `build` is the one `test` and later `lucebench run` cells use. Set LUCEBENCH_BUILD_JOBS to cap parallelism.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export LUCEBENCH_CACHE="${LUCEBENCH_CACHE:-$ROOT/.cache/lucebench}"

case "${1:-}" in
  key)
    "$PY" - <<'EOF'
import hashlib, platform, shutil, subprocess
from pathlib import Path
from lucebench.baselines.llamacpp import pins
cxx = shutil.which("c++") or "c++"
ver = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout.splitlines()[:1]
flags = ""
for line in Path("/proc/cpuinfo").read_text().splitlines():
    if line.startswith(("flags", "Features")):
        flags = " ".join(sorted(line.split(":", 1)[1].split()))
        break
host = hashlib.sha256(f"{platform.machine()}|{ver}|{flags}".encode()).hexdigest()[:16]
print(f"llamacpp-{pins.LLAMACPP_COMMIT[:7]}-{pins.SDIST_SHA256[:12]}-{host}")
EOF
    ;;
  build)
    start=$(date +%s)
    "$PY" - <<'EOF'
from lucebench.baselines.llamacpp.build import build_llamacpp
b = build_llamacpp(backend="cpu")
print(f"llama.cpp {b.commit[:7]} cpu build: {b.bin_dir} (compiled in {b.build_seconds} s when first built)")
EOF
    echo "llama.cpp build step: $(( $(date +%s) - start )) s wall"
    ;;
  test)
    exec "$PY" -m pytest -q tests/baselines/test_llamacpp_unit.py tests/baselines/test_llamacpp_e2e.py
    ;;
  *)
    echo "usage: $0 key|build|test" >&2
    exit 2
    ;;
esac
