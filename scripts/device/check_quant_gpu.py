"""GPU check of quantised GGUF weights on CUDA (run on the device machine from the repository root, PYTHONPATH=.).
All model figures are on SYNTHETIC (random) weights: speed only.

In parallel at the start: the CUDA engines (lucebench-ar, lucebench-gpu-op-check, lucebench-verify-gpu-check),
the CPU `ar` (the 0.8B reference), llama.cpp's CUDA build (niced; from the carried .cache/llamacpp archive,
cached under .cache/lucebench-device like check_llamacpp.py) and the synthetic GGUF files written directly by
`lucebench.models.gguf_synth` (qwen3.5-0.8b and qwen3.5-27b, Q4_K_M as llama.cpp's recipe types them) in /tmp.
Then:
  1. lucebench-gpu-op-check (every op, the matmul_quant / embed_quant / heads_to_tiled entries included), then
     its --time-quant table (matmul_quant alone on the 27B shapes, each n class: ms and weight GB/s);
  2. 0.8B Q4_K_M: greedy tokens of the CUDA `ar` (blocks kept; both GEMVs) against the CPU `ar` (the fp32
     reference of the same dequantised weights) and against the CUDA `ar` with LB_GPU_QUANT=0 (dequantised to
     bf16 at load): agreement and first divergence per prompt;
  3. 27B Q4_K_M, `ar`: decode tok/s (1 warm-up, 5 reps: median and spread), bytes per token (decode_bytes)
     and the roofline % against the measured device copy bandwidth; prefill tok/s at 128 / 512 / 2048; decode
     again with LB_GPU_QGEMV32=1 (the other GEMV);
  4. 27B Q4_K_M: the cost of one verify forward of B + 1 rows against a decode step
     (lucebench-verify-gpu-check --time-model);
  5. llama.cpp llama-bench pp512 / tg128 (-fa on, f16 KV, all layers on the GPU) on the same GGUF, if its build
     finished in time (STAGE=build first on a warm machine makes sure it does).
Writes $OUT/gq/: check_quant_gpu.json, op_check.md, time_quant.md, verify_time_27b.txt, llama-bench logs, build logs.
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
DEADLINE_S = float(os.environ.get("DEADLINE_S", "520" if STAGE == "build" else "420"))
T0 = time.time()
R: dict = {"label": "SYNTHETIC weights (random): speed figures only", "arch": ARCH, "stage": STAGE}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save() -> None:
    (OUT / "check_quant_gpu.json").write_text(json.dumps(R, indent=1, default=str) + "\n")


def run_logged(cmd: list[str], logname: str, env: dict | None = None) -> None:
    with (OUT / logname).open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT, env=env)


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


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def correctness_08b(path: Path) -> None:
    from engine_client import Engine

    prompts = [[(i * 7919 + 11 * k) % 240000 + 100 for i in range(n)] for k, n in enumerate((8, 64))]
    n_gen = 24
    kv = ["--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", "256"]
    runs = {}
    for name, exe, env in (("cuda", GPU_BUILD / "lucebench-ar", None),
                           ("cuda_qgemv32", GPU_BUILD / "lucebench-ar", dict(os.environ, LB_GPU_QGEMV32="1")),
                           ("cuda_bf16", GPU_BUILD / "lucebench-ar", dict(os.environ, LB_GPU_QUANT="0")),
                           ("cpu", CPU_BUILD / "lucebench-ar", None)):
        e = Engine(exe, path, *kv, env=env)
        runs[name] = {"engine": e.ready.get("engine"),
                      "tokens": [e.gen(p, n_gen, ignore_eos=True)["output_ids"] for p in prompts]}
        e.close()
    out = {}
    for ref, other in (("cuda", "cpu"), ("cuda", "cuda_bf16"), ("cuda_qgemv32", "cpu")):
        rows = []
        for i, p in enumerate(prompts):
            a, b = runs[ref]["tokens"][i], runs[other]["tokens"][i]
            rows.append({"prompt_len": len(p), "first_divergence": first_divergence(a, b),
                         "agree": sum(x == y for x, y in zip(a, b)), "n": len(a)})
        out[f"{ref}_vs_{other}"] = rows
        log(f"0.8B Q4_K_M, {ref} (blocks kept) vs {other}: " +
            "; ".join(f"prompt {r['prompt_len']}: {r['agree']}/{r['n']} agree, first divergence {r['first_divergence']}"
                      for r in rows))
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
    decode(e, "decode_27b", "qgemv_kernel, the default")
    pre = {}
    for L in (128, 512, 2048):
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
    e = Engine(GPU_BUILD / "lucebench-ar", path, "--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", "4096",
               env=dict(os.environ, LB_GPU_QGEMV32="1"))
    decode(e, "decode_27b_qgemv32", "LB_GPU_QGEMV32=1: qgemv32_kernel")
    e.close()
    with (OUT / "verify_time_27b.txt").open("w") as f:
        subprocess.run([str(GPU_BUILD / "lucebench-verify-gpu-check"), "--time-model", str(path)], stdout=f,
                       stderr=subprocess.STDOUT, check=False, timeout=240)
    txt = (OUT / "verify_time_27b.txt").read_text()
    print(txt, flush=True)
    R["verify_27b"] = txt


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
    run = run_llama_bench(build, path, n_prompt=[512], n_gen=[128], depth=[0], reps=5, flash_attn=True, kv_k="f16",
                          kv_v="f16", n_gpu_layers=99, stderr_path=OUT / "llama-bench-27b.log", timeout_s=100)
    rows = []
    for rec in run.records:
        tps = rec.tokens_per_s()
        rows.append({"test": rec.name, "tok_s": tps, "mean": statistics.mean(tps), "argv": run.argv})
        log(f"llama.cpp {rec.name} on the same GGUF: {statistics.mean(tps):.1f} tok/s ({len(tps)} reps)")
    R["llamacpp_bench_27b"] = rows
    save()


def main() -> int:
    gguf_path()
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    R["card"] = smi.stdout.strip()
    R["date_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    log(f"card: {R['card']}")
    llama = start_llamacpp_build()
    errors: list[str] = []

    def guarded(fn, *a):
        def go():
            try:
                fn(*a)
            except Exception as exc:  # reported below; the main thread decides
                errors.append(f"{fn.__name__}: {exc!r}")
        th = threading.Thread(target=go)
        th.start()
        return th

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
    log("SUMMARY (SYNTHETIC weights): op check rc {}; 27B Q4_K_M decode {:.1f} tok/s, roofline {:.0f}%; llama.cpp {}"
        .format(R["op_check"]["rc"], d.get("median", 0), d.get("roofline_pct", 0),
                [(r["test"], round(r["mean"], 1)) for r in R.get("llamacpp_bench_27b", [])]))
    return 1 if errors or R["op_check"]["rc"] else 0


if __name__ == "__main__":
    sys.exit(main())
