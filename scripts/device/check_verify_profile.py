"""Where a 27B DFlash verify spends its time, on CUDA (run on the device machine from the repository root,
PYTHONPATH=.). SYNTHETIC (random) weights: the full-shape Qwen3.5-27B Q4_K_M GGUF; speed only.

In parallel at the start: the CUDA build of this tree (into check_dflash_gpu.sh's build folder, with its
source hash, so that its parts below find the engines built), the synthetic GGUF (check_quant_gpu.synth), a
random z-lab-shaped draft for it and the CUPTI injection library. Then:
  1. lucebench-gpu-op-check: its summary, every failed row, the attention_split rows; then
     lucebench-verify-gpu-check (verify + commit == AR greedy through the GPU backend, states after commit);
  2. --time-attention: one attention layer of each shape at 256 .. 128K keys, before's kernel against now's;
  3. --time-verify at contexts 256, 1024, 4096 for B = 22 and at 256, 1024 for B = 8: verify ms against the
     unfused decode step after it;
  4. the verify forward on the GPU clock (CUPTI, --time-verify at context 512, B = 22 and B = 8): the verify
     forwards are the kernel runs from an embed to the next that hold delta_tree; per kernel (name, grid):
     launches a verify, the time it adds (its end minus the previous kernel's end: idle charged to the kernel
     after it) and its median duration, medians over the last 8 verifies; summed by class;
  5. with DFLASH_PARTS (default "lossless-synth speed"; empty: none): check_dflash_gpu.sh's parts: dflash ==
     ar greedy on the synthetic 0.8B (chain and tree, budgets 8/22/40, KV bf16 and q8_0), and the 27B's
     speed at a forced AL of 8.31, budgets 8 and 22 (FORCED ACCEPTANCE, benchmark only), draft / verify /
     commit ms a step.
Writes $OUT/vprof/ (profile.json, *.txt, *.md; dg/ for step 5) and prints the key tables. About 5-6 minutes
on a fresh H100, 7-8 with step 5.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "device"))
OUT = Path(os.environ.get("OUT", "/tmp/out")) / "vprof"
OUT.mkdir(parents=True, exist_ok=True)
import check_quant_gpu as cq  # noqa: E402  (synth, CUPTI library, card)

cq.OUT = OUT
os.environ["OUT"] = str(OUT)
ARCH = os.environ.get("ARCH", "90")
BUILD = Path("/tmp/lb-dflash-build")  # check_dflash_gpu.sh's, same flags and hash: its parts reuse the build
DFLASH_PARTS = os.environ.get("DFLASH_PARTS", "lossless-synth speed").strip()
T0 = time.time()
R = cq.R
R.update({"label": "SYNTHETIC weights (random): speed figures only"})


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save() -> None:
    (OUT / "profile.json").write_text(json.dumps(R, indent=1, default=str) + "\n")


def build() -> None:
    R["build_s"] = cq.cmake_build(ROOT / "engines", BUILD, ["lucebench-gpu-op-check", "lucebench-verify-gpu-check",
                                                           "lucebench-ar", "lucebench-dflash"],
                                  os.cpu_count() or 16, OUT / "build.log", "dflash")


def synth(paths: dict) -> None:
    """The 27B GGUF and, for the DFlash speed part, a random z-lab-shaped draft for it."""
    paths["27b"] = cq.synth("qwen3.5-27b")
    if "speed" not in DFLASH_PARTS.split():
        return
    paths["draft"] = cq.synth_draft("qwen3.5-27b")


def dflash_parts(paths: dict) -> None:
    env = dict(os.environ, OUT=str(OUT), PARTS=DFLASH_PARTS, DFLASH_TARGET=str(paths["27b"]),
               DFLASH_BUDGETS="8,22", DFLASH_N_GEN="256", ARCH=ARCH)
    if "draft" in paths:  # made only for the speed part (synth); the other parts bring their own
        env["DFLASH_DRAFT"] = str(paths["draft"])
    rc, txt = run(["bash", "scripts/device/check_dflash_gpu.sh"], "dflash.log", env, timeout=400)
    rows = [ln for ln in txt.splitlines()
            if ln.strip().startswith("|") or " ar: " in ln or "FAIL" in ln or "lossless" in ln.lower()]
    print("\n".join(rows[-60:]), flush=True)
    R["dflash"] = {"rc": rc, "parts": DFLASH_PARTS, "rows": rows}
    log(f"check_dflash_gpu.sh PARTS='{DFLASH_PARTS}': rc {rc}")
    if rc != 0:
        raise RuntimeError(f"check_dflash_gpu.sh exited {rc}")


def run(args: list[str], name: str, env: dict | None = None, timeout: int = 300) -> tuple[int, str]:
    with (OUT / name).open("w") as f:
        rc = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
    return rc, (OUT / name).read_text()


def kernel_class(name: str) -> str:
    for key, cls in (("qmma", "quantised GEMM (qmma)"), ("qmv", "quantised GEMV (qmv)"), ("gemm", "GEMM (other)"),
                     ("attention", "attention"), ("attn", "attention"), ("delta", "DeltaNet (tree)"),
                     ("conv", "DeltaNet (tree)"), ("norm", "norms"), ("silu", "silu_mul"), ("argmax", "argmax")):
        if key in name:
            return cls
    return "other"


def profile(path: Path, B: int) -> None:
    from timeline_decode import short

    csv_path = OUT / f"timeline_verify_b{B}.csv"
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(cq.TIMELINE_LIB), LB_TIMELINE_OUT=str(csv_path))
    rc, txt = run([str(BUILD / "lucebench-verify-gpu-check"), "--time-verify", str(path), "512", str(B)],
                  f"time_verify_traced_b{B}.txt", env)
    if rc != 0:
        raise RuntimeError(f"traced --time-verify exited {rc}: {txt[-400:]}")
    with open(csv_path) as f:
        rows = sorted(({"start": int(x["start_ns"]), "end": int(x["end_ns"]), "grid": int(x["grid"]),
                        "name": short(x["name"])} for x in csv.DictReader(f)), key=lambda x: x["start"])
    starts = [i for i, x in enumerate(rows) if x["name"].startswith("embed")] + [len(rows)]
    segs = [rows[a:b] for a, b in zip(starts, starts[1:])]
    verifies = [s for s in segs if any("delta_tree" in k["name"] for k in s)][-8:]
    if not verifies:
        raise RuntimeError(f"no verify forwards among {len(rows)} kernel records")
    per: dict[tuple, dict] = {}
    walls = []
    for seg in verifies:
        prev = seg[0]["start"]
        seen: dict[tuple, list] = {}
        for k in seg:
            a = seen.setdefault((k["name"], k["grid"]), [0, 0.0, []])
            a[0] += 1
            a[1] += (k["end"] - prev) / 1e3
            a[2].append((k["end"] - k["start"]) / 1e3)
            prev = k["end"]
        walls.append((seg[-1]["end"] - seg[0]["start"]) / 1e3)
        for key, (cnt, adds, durs) in seen.items():
            p = per.setdefault(key, {"count": cnt, "adds": [], "durs": []})
            p["adds"].append(adds)
            p["durs"] += durs
    table = sorted(({"kernel": n, "grid": g, "count": p["count"], "class": kernel_class(n),
                     "adds_us": statistics.median(p["adds"]), "dur_us_each": statistics.median(p["durs"])}
                    for (n, g), p in per.items()), key=lambda t: -t["adds_us"])
    wall = statistics.median(walls)
    classes: dict[str, list] = {}
    for t in table:
        c = classes.setdefault(t["class"], [0.0, 0])
        c[0] += t["adds_us"]
        c[1] += t["count"]
    launches = sum(t["count"] for t in table)
    R[f"profile_b{B}"] = {"verifies": len(verifies), "wall_us": wall, "launches": launches,
                          "classes": classes, "kernels": table}
    lines = [f"27B verify B = {B} ({B + 1} rows) at context 512 on the GPU clock (CUPTI, median of {len(verifies)}): "
             f"{wall / 1e3:.3f} ms, {launches} kernels", "| class | launches | ms (adds) | share |", "|---|---|---|---|"]
    for c, (us, n) in sorted(classes.items(), key=lambda x: -x[1][0]):
        lines.append(f"| {c} | {n} | {us / 1e3:.3f} | {100 * us / wall:.0f}% |")
    lines += ["", "| kernel | grid | a verify | ms (adds) | us each (duration) |", "|---|---|---|---|---|"]
    for t in table[:28]:
        lines.append(f"| {t['kernel']} | {t['grid']} | {t['count']} | {t['adds_us'] / 1e3:.3f} | {t['dur_us_each']:.1f} |")
    text = "\n".join(lines)
    (OUT / f"profile_b{B}.md").write_text(text + "\n")
    print(text, flush=True)
    save()


def main() -> int:
    log(f"card: {cq.record_card()}")
    errors: list[str] = []
    late_errors: list[str] = []
    paths: dict = {}
    th = [cq.start_guarded(errors, build), cq.start_guarded(errors, cq.build_timeline_lib),
          cq.start_guarded(errors, synth, paths)]
    th[0].join()
    if errors:
        log("FAILED: " + "; ".join(errors))
        return 1
    rc, txt = run([str(BUILD / "lucebench-gpu-op-check")], "op_check.md")
    summary = [ln for ln in txt.splitlines() if "checks," in ln]
    R["op_check"] = {"rc": rc, "summary": summary}
    log(f"op check: rc {rc}, {summary}")
    print("\n".join(ln for ln in txt.splitlines() if "FAIL" in ln or "NOT REPEATABLE" in ln
                    or ln.startswith(("| attention_split", "| delta_tree", "| conv_tree_prep"))), flush=True)
    # the verify path's exactness through the GPU backend: verify + commit == AR greedy on random Qwen3.5 /
    # Qwen3 models, the states after commit, a verify's outputs against the CPU backend's
    try:
        rc, txt = run([str(BUILD / "lucebench-verify-gpu-check")], "verify_gpu_check.txt", timeout=240)
    except subprocess.TimeoutExpired:
        rc, txt = 124, "timed out after 240 s"
    R["verify_gpu_check"] = {"rc": rc, "tail": txt.splitlines()[-3:]}
    log(f"lucebench-verify-gpu-check: rc {rc}; " + " / ".join(txt.splitlines()[-2:]))
    print("\n".join(ln for ln in txt.splitlines() if "FAIL" in ln or "fail" in ln), flush=True)
    if rc != 0:  # recorded at the end: the timings below still run
        late_errors.append(f"lucebench-verify-gpu-check rc {rc}")
    save()
    rc, txt = run([str(BUILD / "lucebench-gpu-op-check"), "--time-attention"], "attention_time.md")
    print("\n".join(ln for ln in txt.splitlines() if ln.startswith("|") and "decode step" not in ln), flush=True)
    for t in th[1:]:
        t.join()
    if errors:
        log("FAILED: " + "; ".join(errors))
        return 1
    for B, ctxs in ((22, "256,1024,4096"), (8, "256,1024")):
        rc, txt = run([str(BUILD / "lucebench-verify-gpu-check"), "--time-verify", str(paths["27b"]), ctxs, str(B)],
                      f"time_verify_b{B}.txt")
        rows = [ln for ln in txt.splitlines() if ln.startswith("| ") and ln[2:3].isdigit()]
        R[f"time_verify_b{B}"] = {"rc": rc, "rows": rows}
        log(f"27B verify B = {B} (rc {rc}): context | B | rows | prefill s | verify ms | decode step ms | argmax\n"
            + "\n".join(rows))
        for r in rows:
            c = [x.strip() for x in r.split("|")]
            log(f"  context {c[1]}: verify / step = {float(c[5]) / float(c[6]):.2f}")
        save()
    if R.get("timeline_lib") == "ok":
        for B in (22, 8):
            try:
                profile(paths["27b"], B)
            except Exception as exc:  # a failed trace must not hide the timings above
                errors.append(f"profile B = {B}: {exc!r}")
                log(f"FAILED profile B = {B}: {exc!r}")
    else:
        log(f"no CUPTI profile: {R.get('timeline_lib')}")
    if DFLASH_PARTS:
        try:
            dflash_parts(paths)
        except Exception as exc:
            errors.append(f"dflash: {exc!r}")
            log(f"FAILED dflash: {exc!r}")
    errors += late_errors
    R["errors"] = errors
    R["wall_s"] = round(time.time() - T0, 1)
    save()
    log(f"SUMMARY ({R['card']}, {R['date_utc']} UTC, SYNTHETIC 27B Q4_K_M): op check {R['op_check']}; errors {errors}")
    return 0 if not errors and R["op_check"]["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
