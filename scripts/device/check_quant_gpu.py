"""GPU check of quantised GGUF weights on CUDA (run on the device machine from the repository root, PYTHONPATH=.).
All model figures are on SYNTHETIC (random) weights: speed only.

In parallel at the start: the CUDA engines (lucebench-ar, lucebench-gpu-op-check, lucebench-verify-gpu-check),
the CPU `ar` (the 0.8B reference), llama.cpp's CUDA build (niced; from the carried .cache/llamacpp archive,
cached under .cache/lucebench-device like check_llamacpp.py) and the synthetic GGUF files written directly by
`lucebench.models.gguf_synth` (qwen3.5-0.8b and qwen3.5-27b, Q4_K_M as llama.cpp's recipe types them) in /tmp.
Then:
  1. lucebench-gpu-op-check (every op, the matmul_quant / embed_quant / heads_to_tiled entries included), then
     its --time-quant table (matmul_quant alone on the 27B shapes, each n class: ms and weight GB/s);
  2. 0.8B Q4_K_M: greedy tokens of the CUDA `ar` (blocks kept: qmv_kernel / qmma_kernel) against the CPU `ar`
     (the fp32 reference of the same dequantised weights) and against the CUDA `ar` with LB_GPU_QUANT=0
     (dequantised to bf16 at load): agreement and first divergence per prompt, and there the reference's
     relative top-2 logit margin ("near-tie" below 2e-2: a rounding flip, not a bug);
  3. 27B Q4_K_M, `ar`: decode tok/s (1 warm-up, 5 reps: median and spread), bytes per token (decode_bytes)
     and the roofline % against the measured device copy bandwidth; prefill tok/s at 128 / 512;
  4. 27B Q4_K_M: where a decode step's time goes, kernel by kernel, on the GPU's clock (CUPTI injection
     library scripts/device/kernel_timeline.cpp, as timeline_decode.py): per kernel and matrix the time it
     adds to the step, and the step's idle time between kernels and between steps;
  5. 27B Q4_K_M: the cost of one verify forward of B + 1 rows against a decode step
     (lucebench-verify-gpu-check --time-model), B in 1, 8, 16, 22, 32, 64;
  6. llama.cpp llama-bench pp512 / tg128 (-fa on, f16 KV, all layers on the GPU) on the same GGUF, if its build
     finished in time (STAGE=build first on a warm machine makes sure it does).
Writes $OUT/gq/: check_quant_gpu.json, op_check.md, time_quant.md, verify_time_27b.txt, timeline_27b.csv,
llama-bench logs, build logs. Before/after: per-matrix qgemv/qgemm against qmv/qmma rows in time_quant (the
op check's test hook names the kernel); decode and verify against BEFORE (this script at ed4dc58 on an H200).
A before/after of two builds on one card is check_dec_gpu.sh (it builds an older commit beside this tree).
STAGE=build: only the builds and the GGUF files (a second call on the warm machine does the rest).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "device"))
OUT = Path(os.environ.get("OUT", "/tmp/out")) / "gq"
OUT.mkdir(parents=True, exist_ok=True)
os.environ["OUT"] = str(OUT)  # engine_client's logs
os.environ.setdefault("LUCEBENCH_CACHE", str(ROOT / ".cache" / "lucebench-device"))
ARCH = os.environ.get("ARCH", "90")
STAGE = os.environ.get("STAGE", "all")
ARCHIVE = Path(os.environ.get("LUCEBENCH_LLAMACPP_SRC", ROOT / ".cache" / "llamacpp" / "llama.cpp-0c1e570.tar.xz"))
GPU_BUILD, CPU_BUILD = Path("/tmp/gq-build-cuda"), Path("/tmp/gq-build-cpu")
SYNTH = Path("/tmp/gq-synth")
# llama-bench starts only if llama.cpp's build is done by then (it takes <= 100 s; the hard limit is 540 s).
# STAGE=build waits longer for the build. A build still running is left running (niced): a second call on the
# warm machine finds it finished in the cache.
DEADLINE_S = float(os.environ.get("DEADLINE_S", "520" if STAGE == "build" else "330"))
# Before qmv_kernel: this script at ed4dc58 (qgemv_kernel / qgemm_kernel), one NVIDIA H200, 2026-11-27.
BEFORE = {"card": "NVIDIA H200", "decode_tok_s": 42.1, "step_ms": 28.510,
          "verify_ms": {1: 29.124, 8: 63.801, 16: 72.785, 22: 78.410, 32: 85.216, 64: 159.702}}
TIMELINE_LIB = Path("/tmp/gq-libkernel_timeline.so")
T0 = time.time()
R: dict = {"label": "SYNTHETIC weights (random): speed figures only", "arch": ARCH, "stage": STAGE}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save() -> None:
    (OUT / "check_quant_gpu.json").write_text(json.dumps(R, indent=1, default=str) + "\n")


def run_logged(cmd: list[str], logname: str, env: dict | None = None) -> None:
    with (OUT / logname).open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT, env=env)


def cmake_build(src: Path, dst: Path, targets: list[str], jobs: int, log_path: Path,
                source_hash: str | None = None) -> float:
    """A CUDA Release build of an engines/ tree (the device scripts' before / after builds); its log in log_path.
    source_hash: LUCEBENCH_SOURCE_HASH (check_dflash_gpu.sh's folder and hash, so that its parts reuse the build).
    Returns the seconds it took."""
    t = time.time()
    hash_arg = [f"-DLUCEBENCH_SOURCE_HASH={source_hash}"] if source_hash else []
    with log_path.open("w") as f:
        subprocess.run(["cmake", "-S", str(src), "-B", str(dst), "-DLUCEBENCH_BACKEND=cuda",
                        f"-DCMAKE_CUDA_ARCHITECTURES={ARCH}", "-DCMAKE_BUILD_TYPE=Release", *hash_arg], check=True,
                       stdout=f, stderr=subprocess.STDOUT)
        subprocess.run(["cmake", "--build", str(dst), "-j", str(jobs), "--target", *targets], check=True, stdout=f,
                       stderr=subprocess.STDOUT)
    return round(time.time() - t, 1)


def synth_08b_checkpoint(log_path: Path) -> None:
    """build_engines.sh's synthetic full-shape Qwen3.5-0.8B (/tmp/qwen35-0.8b-synth, written once a machine)."""
    with log_path.open("w") as f:
        subprocess.run(["bash", "-c", ". scripts/device/build_engines.sh && synth_08b"], cwd=ROOT, check=True, stdout=f,
                       stderr=subprocess.STDOUT)


def build_ours() -> None:
    t = time.time()
    run_logged(["cmake", "-S", "engines", "-B", str(GPU_BUILD), "-DLUCEBENCH_BACKEND=cuda",
                f"-DCMAKE_CUDA_ARCHITECTURES={ARCH}", "-DCMAKE_BUILD_TYPE=Release"], "build_cuda_configure.log")
    run_logged(["cmake", "--build", str(GPU_BUILD), "-j", "14", "--target", "lucebench-ar", "lucebench-gpu-op-check",
                "lucebench-verify-gpu-check"], "build_cuda.log")
    R["build_cuda_s"] = round(time.time() - t, 1)
    t = time.time()
    run_logged(["cmake", "-S", "engines", "-B", str(CPU_BUILD), "-DLUCEBENCH_BACKEND=cpu",
                "-DCMAKE_BUILD_TYPE=Release"], "build_cpu_configure.log")
    run_logged(["cmake", "--build", str(CPU_BUILD), "-j", "14", "--target", "lucebench-ar"], "build_cpu.log")
    R["build_cpu_s"] = round(time.time() - t, 1)
    build_timeline_lib()


def build_timeline_lib() -> None:
    """The CUPTI injection library (as timeline_decode.sh builds it); a missing CUPTI skips the timeline."""
    sh = r'''
CUDA_INC="$(dirname "$(command -v nvcc)")/../include"
WHEELS=$(python3 -c 'import glob, nvidia; print(" ".join(glob.glob(nvidia.__path__[0] + "/*")))' 2>/dev/null)
CUPTI_INC=""
for d in "$CUDA_INC" /usr/local/cuda/extras/CUPTI/include $(for w in $WHEELS; do echo "$w/include"; done); do
  [ -f "$d/cupti.h" ] && { CUPTI_INC=$d; break; }
done
CUPTI_LIB=$(find "$(dirname "$(command -v nvcc)")/.." /usr/local/cuda/extras/CUPTI $WHEELS -name 'libcupti.so*' 2>/dev/null | head -1)
[ -n "$CUPTI_INC" ] && [ -n "$CUPTI_LIB" ] || { echo "CUPTI not found"; exit 1; }
g++ -O2 -shared -fPIC scripts/device/kernel_timeline.cpp -I"$CUPTI_INC" -I"$CUDA_INC" "$CUPTI_LIB" \
  -Wl,-rpath,"$(dirname "$CUPTI_LIB")" -o "$1"
'''
    with (OUT / "build_timeline.log").open("w") as f:
        rc = subprocess.run(["bash", "-c", sh, "bash", str(TIMELINE_LIB)], stdout=f, stderr=subprocess.STDOUT).returncode
    R["timeline_lib"] = "ok" if rc == 0 else "not built: see build_timeline.log"


def start_llamacpp_build() -> subprocess.Popen | None:
    """llama.cpp's CUDA build in a niced child process (it must not slow our build down); its result file
    names the build folder."""
    if not ARCHIVE.exists():
        R["llamacpp"] = f"missing {ARCHIVE}: carry .cache/llamacpp"
        return None
    code = ("import json,sys; from lucebench.baselines.llamacpp.build import build_llamacpp; "
            f"b = build_llamacpp(backend='cuda', arch='{ARCH}', source='{ARCHIVE}'); "
            f"open('{OUT}/llamacpp_build.json', 'w').write(json.dumps(b.to_dict(), default=str))")
    f = (OUT / "llamacpp_build.log").open("w")
    return subprocess.Popen(["nice", "-n", "15", sys.executable, "-c", code], stdout=f, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))


def gguf_path() -> None:
    """The gguf package: the llama.cpp source's gguf-py where the device image lacks it."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        from lucebench.baselines.llamacpp.source import locate_source

        sys.path.insert(0, str(locate_source(ARCHIVE).root / "gguf-py"))


def synth(shape: str) -> Path:
    from lucebench.models.gguf_synth import synthesize_gguf
    from lucebench.models.shapes import get_shape

    out = SYNTH / shape
    path = out / "model-q4_k_m.gguf"
    if not path.is_file():
        res = synthesize_gguf(get_shape(shape), out, quant="q4_k_m", seed=0)
        R.setdefault("synth", {})[shape] = {"seconds": round(res.seconds, 1), "bytes": res.weight_bytes,
                                            "types": res.types, "n_params": res.n_params}
        log(f"wrote SYNTHETIC {shape} Q4_K_M GGUF: {res.weight_bytes / 1e9:.2f} GB in {res.seconds:.1f} s, "
            f"types {res.types}")
    return path


def synth_draft(shape: str) -> Path:
    """A random z-lab-shaped DFlash draft for `shape` (SYNTHETIC, seed 1), made once a machine."""
    from lucebench.models.dflash_draft import synthesize_draft
    from lucebench.models.shapes import get_shape

    cfg, draft = SYNTH / f"{shape}-config", SYNTH / f"{shape}-draft"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.json").write_text(json.dumps(get_shape(shape).config))
    if not (draft / "model.safetensors").is_file():
        synthesize_draft(cfg, draft, seed=1)
    return draft


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# A flip of the reference's greedy choice below this relative top-2 margin ((top1 - top2) / max |logit|) is a
# near-tie: rounding (fp32 sums in another order, bf16 weights), not a wrong kernel (as check_dflash_gpu.py).
NEAR_TIE = 2e-2


def rel_margin(logits: list[float]) -> float:
    a, b = sorted(logits, reverse=True)[:2]
    return (a - b) / max(max(abs(x) for x in logits), 1e-30)


def divergence_text(r: dict) -> str:
    d = r["first_divergence"]
    if d is None:
        return "no divergence"
    if "ref_rel_margin" not in r:
        return f"first divergence {d}"
    return (f"first divergence {d} (reference's relative top-2 margin {r['ref_rel_margin']:.1e}"
            f"{', near-tie' if r['near_tie'] else ''})")


def correctness_08b(path: Path) -> None:
    from engine_client import Engine

    prompts = [[(i * 7919 + 11 * k) % 240000 + 100 for i in range(n)] for k, n in enumerate((8, 64))]
    n_gen = 24
    kv = ["--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", "256"]
    runs: dict = {}
    engines: dict = {}  # kept open: a divergence asks its reference for the logits there
    try:
        for name, exe, env in (("cuda", GPU_BUILD / "lucebench-ar", None),
                               ("cuda_bf16", GPU_BUILD / "lucebench-ar", dict(os.environ, LB_GPU_QUANT="0")),
                               ("cpu", CPU_BUILD / "lucebench-ar", None)):
            e = engines[name] = Engine(exe, path, *kv, env=env)
            runs[name] = {"engine": e.ready.get("engine"),
                          "tokens": [e.gen(p, n_gen, ignore_eos=True)["output_ids"] for p in prompts]}
        out: dict = {}
        # (build, reference): the CPU `ar` (fp32 on the same dequantised weights) and the CUDA `ar` with the
        # weights dequantised to bf16 at load
        for ref, other in (("cuda", "cpu"), ("cuda", "cuda_bf16")):
            rows = []
            for i, p in enumerate(prompts):
                a, b = runs[ref]["tokens"][i], runs[other]["tokens"][i]
                d = first_divergence(a, b)
                row = {"prompt_len": len(p), "first_divergence": d, "agree": sum(x == y for x, y in zip(a, b)),
                       "n": len(a)}
                if d is not None and d < min(len(a), len(b)):
                    # how close the reference's own choice was there: its logits after the prompt and its
                    # tokens up to the divergence
                    lr = engines[other].gen(p + b[:d], 1, return_logits=True)
                    row["ref_rel_margin"] = rel_margin(lr["last_logits"])
                    row["near_tie"] = row["ref_rel_margin"] < NEAR_TIE
                    row["ref_token"], row["token"] = b[d], a[d]
                rows.append(row)
            out[f"{ref}_vs_{other}"] = rows
            log(f"0.8B Q4_K_M, {ref} (blocks kept) vs {other}: " +
                "; ".join(f"prompt {r['prompt_len']}: {r['agree']}/{r['n']} agree, {divergence_text(r)}" for r in rows))
    finally:
        for e in engines.values():
            e.close()
    out["runs"] = runs
    R["correctness_08b"] = out
    save()


def measure_27b(path: Path) -> None:
    from engine_client import Engine

    from lucebench.measure.bandwidth import measure_copy_bandwidth

    bw = measure_copy_bandwidth(0, size_bytes=2 << 30, repeats=10)
    R["copy_bandwidth_Bps"] = bw
    log(f"device copy bandwidth (read + write, 2 GiB): {bw / 1e9:.0f} GB/s" if bw else "no copy bandwidth (no device?)")
    V = 248320 - 300  # ids below the special tokens

    def ids(n: int, step: int) -> list[int]:
        return [(i * step) % V + 100 for i in range(n)]

    prompt = ids(32, 7919)

    def decode(e: Engine, key: str, what: str) -> None:
        e.gen(prompt, 16, ignore_eos=True)  # warm-up (graph capture)
        dec = []
        bpt = None
        for _ in range(5):
            r = e.gen(prompt, 128, ignore_eos=True)
            dec.append(r["decode_steps"] / (r["timing"]["decode_ms"] / 1e3))
            bpt = r.get("bytes_per_token")
        med = statistics.median(dec)
        R[key] = {"tok_s": dec, "median": med, "spread": [min(dec), max(dec)], "bytes_per_token": bpt,
                  "n_gen": 128, "prompt": 32}
        if bpt and bw:
            R[key]["roofline_pct"] = 100.0 * bpt * med / bw
        log(f"27B Q4_K_M decode ({what}): median {med:.1f} tok/s (min {min(dec):.1f}, max {max(dec):.1f}, 5 reps), "
            f"{(bpt or 0) / 1e9:.2f} GB a token, roofline {R[key].get('roofline_pct', 0):.0f}% of the copy bandwidth")
        save()

    t = time.time()
    e = Engine(GPU_BUILD / "lucebench-ar", path, "--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", "4096")
    R["load_27b_s"] = round(time.time() - t, 1)
    R["ready_27b"] = {k: e.ready.get(k) for k in ("model", "engine", "device")}
    log(f"27B loaded in {R['load_27b_s']} s: {json.dumps(e.ready.get('model'))[:300]}")
    V = min(V, int(e.ready["model"]["vocab_size"]) - 300)
    prompt = ids(32, 7919)
    decode(e, "decode_27b", "qmv_kernel")
    pre = {}
    for L in (128, 512):
        p = ids(L, 104729)
        ts = []
        for _ in range(3):
            r = e.gen(p, 1, ignore_eos=True)
            ts.append(L / (r["timing"]["prefill_ms"] / 1e3))
        pre[L] = {"tok_s": ts, "median": statistics.median(ts)}
        log(f"27B Q4_K_M prefill {L}: median {pre[L]['median']:.0f} tok/s")
    R["prefill_27b"] = pre
    e.close()
    save()
    try:
        timeline_27b(path, prompt)
    except Exception as exc:  # the breakdown is a diagnosis: its failure must not hide the figures after it
        R["timeline_27b"] = f"failed: {exc!r}"
        log(f"timeline FAILED: {exc!r}")
    save()
    with (OUT / "verify_time_27b.txt").open("w") as f:
        subprocess.run([str(GPU_BUILD / "lucebench-verify-gpu-check"), "--time-model", str(path)], stdout=f,
                       stderr=subprocess.STDOUT, check=False, timeout=240)
    txt = (OUT / "verify_time_27b.txt").read_text()
    print(txt, flush=True)
    R["verify_27b"] = txt
    verify_table()


def kernel_class(name: str) -> str:
    for key, cls in (("qmv_kernel", "quantised GEMV (qmv)"), ("qmma", "quantised GEMM (qmma)"), ("qgemv", "quantised GEMV (qgemv)"),
                     ("qgemm", "quantised GEMM"), ("qsplit", "quantised GEMM"), ("delta", "DeltaNet (conv/prep/rule)"),
                     ("conv1d", "DeltaNet (conv/prep/rule)"), ("gated_rmsnorm", "DeltaNet (conv/prep/rule)"),
                     ("attn", "attention"), ("heads_to_tiled", "heads_to_tiled"), ("rmsnorm", "norms, silu, embed"),
                     ("silu", "norms, silu, embed"), ("embed", "norms, silu, embed"), ("argmax", "argmax, pos"),
                     ("pos", "argmax, pos")):
        if key in name:
            return cls
    return "other"


def timeline_27b(path: Path, prompt: list[int]) -> None:
    """A decode step's kernels on the GPU's clock: each kernel's duration and the time it adds to the step
    (its end minus the previous kernel's end, so idle time is charged to the kernel after it), medians over
    the steady-state steps, summed per kernel (name and grid: the grid tells the matrices apart)."""
    if R.get("timeline_lib") != "ok":
        log(f"timeline skipped: {R.get('timeline_lib')}")
        return
    from engine_client import Engine
    from timeline_decode import short

    csv_path = OUT / "timeline_27b.csv"
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(TIMELINE_LIB), LB_TIMELINE_OUT=str(csv_path))
    e = Engine(GPU_BUILD / "lucebench-ar", path, "--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", "4096", env=env)
    e.gen(prompt, 8, ignore_eos=True)
    r = e.gen(prompt, 48, ignore_eos=True)
    e.close()
    traced_tok_s = r["decode_steps"] / (r["timing"]["decode_ms"] / 1e3)
    import csv as csvmod

    with open(csv_path) as f:
        rows = sorted(({"start": int(x["start_ns"]), "end": int(x["end_ns"]), "grid": int(x["grid"]),
                        "name": short(x["name"])} for x in csvmod.DictReader(f)), key=lambda x: x["start"])
    timeline_summary(rows, traced_tok_s)


def timeline_summary(rows: list[dict], traced_tok_s: float) -> None:
    """rows: kernel records (start, end ns; grid; short name) sorted by start; the decode steps begin at embed."""
    starts = [i for i, x in enumerate(rows) if x["name"].startswith("embed")]
    steps = [rows[a:b] for a, b in zip(starts, starts[1:])][-40:]  # the last generation's decode steps
    common = statistics.mode(len(st) for st in steps)
    pairs = [(a[-1]["end"], b) for a, b in zip(steps, steps[1:]) if len(b) == common and len(a) == common][2:-2]
    if not pairs:
        raise RuntimeError(f"no steady decode steps in {len(rows)} kernel records")
    per: dict[tuple, dict] = {}
    gaps_total = []
    for before, st in pairs:
        prev = before
        gsum = 0.0
        for k in st:
            key = (k["name"], k["grid"])
            a = per.setdefault(key, {"n_per_step": 0, "adds": [], "durs": []})
            a["adds"].append((k["end"] - prev) / 1e3)
            a["durs"].append((k["end"] - k["start"]) / 1e3)
            gsum += max(0.0, (k["start"] - prev) / 1e3)
            prev = k["end"]
        gaps_total.append(gsum)
    n_steps = len(pairs)
    table = []
    for (name, grid), a in per.items():
        cnt = len(a["adds"]) // n_steps
        table.append({"kernel": name, "grid": grid, "count": cnt, "class": kernel_class(name),
                      "adds_us_step": sum(a["adds"]) / n_steps, "dur_us_each": statistics.median(a["durs"])})
    table.sort(key=lambda x: -x["adds_us_step"])
    step_us = [(st[-1]["end"] - before) / 1e3 for before, st in pairs]
    step_med = statistics.median(step_us)
    classes: dict[str, float] = {}
    for t in table:
        classes[t["class"]] = classes.get(t["class"], 0.0) + t["adds_us_step"]
    first_gap = statistics.median((st[0]["start"] - before) / 1e3 for before, st in pairs)
    R["timeline_27b"] = {"steps": n_steps, "kernels_per_step": common, "step_us_median": step_med,
                         "idle_us_per_step": statistics.median(gaps_total), "between_steps_gap_us": first_gap,
                         "tok_s_traced": traced_tok_s, "classes_us": classes, "kernels": table}
    log(f"27B decode step on the GPU clock (CUPTI; {n_steps} steps, {common} kernels a step): median "
        f"{step_med / 1e3:.3f} ms; idle between kernels {statistics.median(gaps_total) / 1e3:.3f} ms a step, of which "
        f"{first_gap / 1e3:.3f} ms before the step's first kernel; traced decode {traced_tok_s:.1f} tok/s")
    lines = ["| class | ms a step | share |", "|---|---|---|"]
    for c, us in sorted(classes.items(), key=lambda x: -x[1]):
        lines.append(f"| {c} | {us / 1e3:.3f} | {100 * us / step_med:.0f}% |")
    lines += ["", "| kernel | grid | a step | ms a step (adds) | us each (duration) |", "|---|---|---|---|---|"]
    for t in table[:30]:
        lines.append(f"| {t['kernel']} | {t['grid']} | {t['count']} | {t['adds_us_step'] / 1e3:.3f} | "
                     f"{t['dur_us_each']:.1f} |")
    print("\n".join(lines), flush=True)
    (OUT / "timeline_27b.md").write_text("\n".join(lines) + "\n")


def llama_bench(proc: subprocess.Popen | None, path: Path) -> None:
    if proc is None:
        return
    left = DEADLINE_S - (time.time() - T0)
    try:
        proc.wait(timeout=max(1.0, left))
    except subprocess.TimeoutExpired:
        R["llamacpp"] = (f"build not finished after {time.time() - T0:.0f} s (left running): call again on the warm "
                         "machine (STAGE=build first if needed)")
        log(R["llamacpp"])
        return
    if proc.returncode != 0:
        R["llamacpp"] = "build failed: see llamacpp_build.log"
        log(R["llamacpp"])
        return
    from lucebench.baselines.llamacpp.bench import run_llama_bench
    from lucebench.baselines.llamacpp.build import build_llamacpp

    build = build_llamacpp(backend="cuda", arch=ARCH, source=ARCHIVE)  # cache hit
    R["llamacpp_build"] = json.loads((OUT / "llamacpp_build.json").read_text())
    if STAGE == "build":
        return
    if time.time() - T0 > DEADLINE_S:
        R["llamacpp"] = f"skipped: {time.time() - T0:.0f} s gone, past the {DEADLINE_S:.0f} s guard"
        log(R["llamacpp"])
        return
    run = run_llama_bench(build, path, n_prompt=[512], n_gen=[128], depth=[0], reps=3, flash_attn=True, kv_k="f16",
                          kv_v="f16", n_gpu_layers=99, stderr_path=OUT / "llama-bench-27b.log", timeout_s=100)
    rows = []
    for rec in run.records:
        tps = rec.tokens_per_s()
        rows.append({"test": rec.name, "tok_s": tps, "mean": statistics.mean(tps), "argv": run.argv})
        log(f"llama.cpp {rec.name} on the same GGUF: {statistics.mean(tps):.1f} tok/s ({len(tps)} reps)")
    R["llamacpp_bench_27b"] = rows
    save()


def verify_table() -> None:
    """The verify cost table (B, rows, ms, / this run's step) beside BEFORE's, parsed from verify_time_27b.txt."""
    import re

    txt = R.get("verify_27b", "")
    m = re.search(r"decode step \(\w+ graph\) ([0-9.]+) ms", txt)
    rows = re.findall(r"^\| (\d+) \| (\d+) \| ([0-9.]+) \| ([0-9.]+) \|", txt, re.M)
    if not m or not rows:
        log("verify table: not found in verify_time_27b.txt")
        return
    step = float(m.group(1))
    out = [f"| B | rows | verify ms | / step ({step:.2f} ms) | before ({BEFORE['card']}) ms | before / step "
           f"({BEFORE['step_ms']:.2f} ms) |", "|---|---|---|---|---|---|"]
    for b, n, ms, ratio in rows:
        bv = BEFORE["verify_ms"].get(int(b))
        out.append(f"| {b} | {n} | {float(ms):.2f} | {float(ratio):.2f} | {bv} | "
                   f"{bv / BEFORE['step_ms']:.2f} |" if bv else f"| {b} | {n} | {ms} | {ratio} | | |")
    R["verify_27b_table"] = {"step_ms": step, "rows": rows}
    log("27B Q4_K_M verify cost (this run) against before:\n" + "\n".join(out))


def start_guarded(errors: list[str], fn, *a) -> threading.Thread:
    """fn(*a) on a thread of its own; an exception becomes a line in `errors` (the main thread decides)."""
    def go():
        try:
            fn(*a)
        except Exception as exc:
            errors.append(f"{fn.__name__}: {exc!r}")
    th = threading.Thread(target=go)
    th.start()
    return th


def record_card() -> str:
    """The card (name, driver, memory) and the UTC date into R, for every figure of the run; returns the card."""
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    R["card"] = smi.stdout.strip()
    R["date_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    return R["card"]


def main() -> int:
    gguf_path()
    log(f"card: {record_card()}")
    llama = start_llamacpp_build()
    errors: list[str] = []

    def guarded(fn, *a):
        return start_guarded(errors, fn, *a)

    paths: dict[str, Path] = {}

    def synth_all() -> None:
        paths["0.8b"] = synth("qwen3.5-0.8b")
        paths["27b"] = synth("qwen3.5-27b")

    tb, ts = guarded(build_ours), guarded(synth_all)
    tb.join()
    log(f"our builds done (CUDA {R.get('build_cuda_s')} s, CPU {R.get('build_cpu_s')} s)")
    ts.join()
    save()
    if errors:
        log("FAILED: " + "; ".join(errors))
        return 1
    if STAGE == "build":
        llama_bench(llama, paths["27b"])
        save()
        return 0
    rc = subprocess.run([str(GPU_BUILD / "lucebench-gpu-op-check")], capture_output=True, text=True)
    (OUT / "op_check.md").write_text(rc.stdout + rc.stderr)
    quant_rows = [ln for ln in rc.stdout.splitlines() if "_quant" in ln or "heads_to_tiled" in ln]
    print("\n".join(quant_rows), flush=True)
    R["op_check"] = {"rc": rc.returncode, "summary": rc.stdout.strip().splitlines()[-1:], "quant_rows": quant_rows}
    log(f"op check: {R['op_check']['summary']}")
    # A kernel whose every op-check row did not come back "ok" (failed, or the check died before it): the engine
    # runs below still use it (there is no switch), so the figures say so and the script fails at the end.
    for kernel in ("qmv_kernel", "qmma_kernel"):
        rows = [ln for ln in quant_rows if kernel in ln]
        good = sum(ln.rstrip().endswith("ok |") for ln in rows)
        if not rows or good != len(rows):
            R.setdefault("kernels_not_ok", []).append(kernel)
            log(f"WARNING: {kernel}: {good} of {len(rows)} op-check rows ok: the engine figures below run on a "
                "kernel that failed its check")
    tq = subprocess.run([str(GPU_BUILD / "lucebench-gpu-op-check"), "--time-quant"], capture_output=True, text=True)
    (OUT / "time_quant.md").write_text(tq.stdout + tq.stderr)
    print(tq.stdout, flush=True)
    save()
    for fn, arg in ((correctness_08b, paths["0.8b"]), (measure_27b, paths["27b"])):
        try:
            fn(arg)
        except Exception as exc:
            errors.append(f"{fn.__name__}: {exc!r}")
            log(f"FAILED {fn.__name__}: {exc!r}")
        save()
    try:
        llama_bench(llama, paths["27b"])
    except Exception as exc:
        errors.append(f"llama_bench: {exc!r}")
    R["errors"] = errors
    R["wall_s"] = round(time.time() - T0, 1)
    save()
    d = R.get("decode_27b", {})
    tl = R.get("timeline_27b", {})
    v = {int(r[0]): float(r[3]) for r in R.get("verify_27b_table", {}).get("rows", [])}
    log("SUMMARY (SYNTHETIC weights, {}): op check rc {}; 27B Q4_K_M decode {:.1f} tok/s, roofline {:.0f}% "
        "(before, at ed4dc58 on an H200: {} tok/s); GPU step {:.2f} ms, "
        "quantised GEMVs {:.2f} ms of it; verify B=22 {} x a step (before: {:.2f}x); llama.cpp {}"
        .format(R.get("card", "?").split(",")[0], R["op_check"]["rc"], d.get("median", 0), d.get("roofline_pct", 0),
                BEFORE["decode_tok_s"],
                tl.get("step_us_median", 0) / 1e3 if isinstance(tl, dict) else 0,
                tl.get("classes_us", {}).get("quantised GEMV (qmv)", 0) / 1e3 if isinstance(tl, dict) else 0,
                v.get(22, "?"), BEFORE["verify_ms"][22] / BEFORE["step_ms"],
                [(r["test"], round(r["mean"], 1)) for r in R.get("llamacpp_bench_27b", [])]))
    return 1 if errors or R["op_check"]["rc"] or R.get("kernels_not_ok") else 0


if __name__ == "__main__":
    sys.exit(main())
