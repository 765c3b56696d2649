# Sourced by the device scripts: one CUDA build of an engines/ tree, the same flags for every caller.
#   build_engines SRC BUILD_DIR SOURCE_HASH "EXTRA_CMAKE_ARGS" TARGET...      (ARCH must be set)
build_engines() {
  local src=$1 dir=$2 hash=$3 extra=$4
  shift 4
  # shellcheck disable=SC2086  # extra holds zero or more cmake arguments
  cmake -S "$src" -B "$dir" -DLUCEBENCH_BACKEND=cuda -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DCMAKE_BUILD_TYPE=Release -DLUCEBENCH_SOURCE_HASH="$hash" $extra \
    && cmake --build "$dir" -j 14 --target "$@"
}

# The synthetic full-shape Qwen3.5-0.8B the device scripts share (check_megakernel.py's SHAPE and CKPT),
# written once per machine.
synth_08b() {
  [ -f /tmp/qwen35-0.8b-synth/config.json ] && return 0
  PYTHONPATH=.:tests/engines python3 - <<'PY'
import sys
import torch
import qwen35_synth as synth
sys.path.insert(0, "scripts/device")
from check_megakernel import SHAPE, CKPT
synth.save(synth.make_model(seed=0, **SHAPE), CKPT, torch.bfloat16)
PY
}
