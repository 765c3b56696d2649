#!/usr/bin/env bash
# Install headless Chromium for the report rendering test (tests/reports/test_html_chromium.py).
# Debian/Ubuntu: the `chromium` package (Ubuntu's is a snap shim; there use chromium-browser or
# google-chrome, which the test also finds). Idempotent: does nothing when a binary is present.
set -euo pipefail

for bin in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$bin" >/dev/null 2>&1; then
    echo "found $(command -v "$bin")"
    exit 0
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
command -v chromium
