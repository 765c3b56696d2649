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
