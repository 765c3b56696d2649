"""index.html renders in headless Chromium and every plot image loads (naturalWidth > 0).

Skipped only when no Chromium binary is installed; CI installs one with scripts/ci/install_chromium.sh.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from lucebench.reports.build import build_report

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM = next((p for b in BINARIES if (p := shutil.which(b))), None)

# Appended to a copy of the page (same folder, so relative paths resolve): after the load event it
# writes the state of every <img> into the DOM, which --dump-dom then prints.
PROBE = """<img src="definitely-missing.png" alt="control">
<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "image-check";
  out.textContent = JSON.stringify([...document.images].map(
      i => ({src: i.getAttribute("src"), loaded: i.complete && i.naturalWidth > 0, width: i.naturalWidth})));
  document.body.appendChild(out);
});
</script>
</body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (CI installs it: scripts/ci/install_chromium.sh)")
def test_every_image_loads_in_headless_chromium(fab, tmp_path):
    files = build_report([fab.gpu_result(), fab.cpu_result()], tmp_path / "rep")
    html = files.html.read_text(encoding="utf-8")
    probe = files.out_dir / "_probe.html"
    probe.write_text(html.replace("</body>", PROBE), encoding="utf-8")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--allow-file-access-from-files", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    match = re.search(r'<pre id="image-check">(.*?)</pre>', proc.stdout, re.DOTALL)
    assert match, f"no probe output; chromium rc={proc.returncode} stderr={proc.stderr[-2000:]}"
    images = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    by_src = {i["src"]: i for i in images}
    # The control image must fail to load, otherwise the probe proves nothing.
    assert by_src.pop("definitely-missing.png")["loaded"] is False
    assert set(by_src) == {p.name for p in files.plots}
    broken = [s for s, i in by_src.items() if not i["loaded"]]
    assert not broken, f"images not loaded: {broken}"
    assert all(i["width"] > 0 for i in by_src.values())
