# The carried wheels: lucebench's dependencies that the device image lacks (pydantic, gguf, typer, ...;
# run_config.sh says how .whl/ is made), installed into /tmp/site, which goes first on PYTHONPATH.
#   . scripts/device/wheels.sh; install_wheels DIR...   the first DIR that exists; status 1 if none does or pip fails
install_wheels() {
  local w
  for w in "$@"; do
    if [ -d "$w" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w"/*.whl \
        || return 1
      export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
      return 0
    fi
  done
  return 1
}
