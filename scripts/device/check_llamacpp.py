"""GPU check of the llama.cpp baseline (run on the device machine from the repository root, PYTHONPATH=.).

1. builds the pinned llama.cpp for CUDA (sm_90 unless $ARCH) from the carried stripped source archive
   (.cache/llamacpp/llama.cpp-0c1e570.tar.xz, made here by
   `python -m lucebench.baselines.llamacpp.packsrc pack .cache/llamacpp/llama.cpp-0c1e570.tar.xz`);
2. synthesises a full-shape Qwen3.5-0.8B random checkpoint (BF16) with lucebench's synthesiser;
3. converts it to GGUF BF16 and Q4_K_M with llama.cpp's own converter and llama-quantize;
4. runs llama-bench pp520 / tg128 -r 5 (-fa on, f16 KV, all layers on the GPU) on both, and one
   server-mode protocol round trip (greedy ids stable across two requests);
5. prints a table and writes $OUT/llamacpp_bench.jsonl (raw llama-bench rows) and $OUT/check_llamacpp.json.

Everything is cached under .cache/lucebench-device, so with STAGE=build a first call may stop after the
CUDA build and a second call (machine still warm) does the rest.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("LUCEBENCH_CACHE", str(ROOT / ".cache" / "lucebench-device"))
ARCHIVE = Path(os.environ.get("LUCEBENCH_LLAMACPP_SRC", ROOT / ".cache" / "llamacpp" / "llama.cpp-0c1e570.tar.xz"))
ARCH = os.environ.get("ARCH", "90")
STAGE = os.environ.get("STAGE", "all")
# The defaults are the GPU check; BACKEND=cpu SHAPE=tiny PP=64 TG=16 REPS=2 runs the same path on a CPU box.
BACKEND = os.environ.get("BACKEND", "cuda")
SHAPE = os.environ.get("SHAPE", "qwen3.5-0.8b")
PP, TG, REPS = int(os.environ.get("PP", "520")), int(os.environ.get("TG", "128")), int(os.environ.get("REPS", "5"))
NGL = 99 if BACKEND != "cpu" else 0
summary: dict = {"arch": ARCH, "backend": BACKEND, "shape": SHAPE, "pp": PP, "tg": TG, "reps": REPS}


def log(msg: str) -> None:
    print(msg, flush=True)


def save() -> None:
    (OUT / "check_llamacpp.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")


def synth_checkpoint(out: Path) -> Path:
    """$SHAPE (Qwen3.5-0.8B), BF16, lucebench's synthesiser (seed 0: the weights the engine checks use)."""
    if (out / "config.json").is_file():
        return out
    from lucebench.models.shapes import get_shape
    from lucebench.models.synth import synthesize

    t = time.time()
    synthesize(get_shape(SHAPE), out, seed=0, dtype="bf16")
    summary["synth_seconds"] = round(time.time() - t, 1)
    return out


def main() -> int:
    from lucebench.baselines.llamacpp.bench import run_llama_bench
    from lucebench.baselines.llamacpp.build import build_llamacpp
    from lucebench.baselines.llamacpp.source import locate_source

    if not ARCHIVE.exists():
        log(f"missing {ARCHIVE}: carry .cache/llamacpp (see this script's docstring)")
        return 2
    src = locate_source(ARCHIVE)
    sys.path.insert(0, str(src.root / "gguf-py"))  # gguf is not installed on the device image
    summary["source"] = src.to_dict()
    log(f"llama.cpp {src.commit} source hash {src.source_hash[:16]}")
    smi_query = "--query-gpu=name,driver_version,power.limit,clocks.max.sm"
    for tool in (["nvcc", "--version"], ["cmake", "--version"], ["nvidia-smi", smi_query, "--format=csv,noheader"]):
        try:
            r = subprocess.run(tool, capture_output=True, text=True, check=False)
            summary.setdefault("tools", {})[tool[0]] = (r.stdout.strip().splitlines() or ["?"])[-1]
        except OSError:
            summary.setdefault("tools", {})[tool[0]] = None
    t = time.time()
    build = build_llamacpp(backend=BACKEND, arch=ARCH if BACKEND != "cpu" else None, source=ARCHIVE)
    summary["build"] = build.to_dict()
    summary["build_wall_seconds_this_call"] = round(time.time() - t, 1)
    log(f"{BACKEND} build: {build.build_seconds} s (this call {summary['build_wall_seconds_this_call']} s); {build.bin_dir}")
    save()
    if STAGE == "build":
        return 0

    from lucebench.baselines.llamacpp.convert import prepare_gguf

    ckpt = synth_checkpoint(Path(os.environ["LUCEBENCH_CACHE"]) / f"ckpt-{SHAPE}-bf16-seed0")
    rows = []
    table = []
    with (OUT / "llamacpp_bench.jsonl").open("w") as jl:
        for dtype in ("bf16", "q4_k_m"):
            t = time.time()
            gguf = prepare_gguf(ckpt, dtype=dtype, build=build)
            summary.setdefault("convert_seconds", {})[dtype] = round(time.time() - t, 1)
            run = run_llama_bench(build, gguf, n_prompt=[PP], n_gen=[TG], depth=[0], reps=REPS, flash_attn=True,
                                  kv_k="f16", kv_v="f16", n_gpu_layers=NGL, stderr_path=OUT / f"llama-bench-{dtype}.log")
            for rec in run.records:
                tps = rec.tokens_per_s()
                row = {"dtype": dtype, "gguf_bytes": gguf.stat().st_size, "argv": run.argv, "version": run.version,
                       **rec.to_dict(), "tokens_per_s": tps}
                jl.write(json.dumps(row) + "\n")
                rows.append(row)
                table.append((dtype, rec.name, statistics.mean(tps), statistics.stdev(tps) if len(tps) > 1 else 0.0,
                              len(tps)))
            save()
    summary["bench"] = [{k: r[k] for k in ("dtype", "test", "samples_ns", "tokens_per_s", "argv")} for r in rows]

    # server mode: one protocol round trip on the BF16 file (ready, 2 identical requests, shutdown)
    from lucebench.baselines.llamacpp.adapter import command

    gguf = prepare_gguf(ckpt, dtype="bf16", build=build)
    argv = command(gguf, build=build, mode="server", ctx=1024, kv_k="f16", kv_v="f16", flash_attn=True,
                   n_gpu_layers=NGL, threads=None) + ["--log", str(OUT / "llama-server.log")]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = json.loads(p.stdout.readline())
    server = {"ready_type": ready.get("type"), "device": ready.get("device")}
    if ready.get("type") == "ready":
        vocab = (ready.get("model") or {}).get("vocab_size") or 1000
        prompt = [(i * 7919) % (vocab - 16) + 8 for i in range(PP)]
        outs = []
        for i in range(2):
            p.stdin.write(json.dumps({"type": "generate", "id": f"s{i}", "prompt_ids": prompt, "n_gen": TG,
                                      "ignore_eos": True}) + "\n")
            p.stdin.flush()
            outs.append(json.loads(p.stdout.readline()))
        p.stdin.write('{"type": "shutdown"}\n')
        p.stdin.flush()
        server["exit"] = p.wait(timeout=120)
        server["ids_stable"] = outs[0].get("output_ids") == outs[1].get("output_ids")
        server["n_gen"] = [len(o.get("output_ids", [])) for o in outs]
        server["timing"] = [o.get("timing") for o in outs]
        t1 = outs[1]["timing"]
        table.append(("bf16", f"server pp{PP}", PP / (t1["prefill_ms"] / 1e3), 0.0, 1))
        table.append(("bf16", f"server tg{TG}", (TG - 1) / (t1["decode_ms"] / 1e3), 0.0, 1))
    else:
        server["error"] = ready
        p.kill()
    summary["server"] = server
    save()

    log(f"\n{'gguf':8} {'test':18} {'tok/s':>12} {'± stddev':>10} {'n':>3}")
    for dtype, name, mean, sd, n in table:
        log(f"{dtype:8} {name:18} {mean:12.1f} {sd:10.1f} {n:3d}")
    log(f"\nserver mode: ids stable {server.get('ids_stable')}, n_gen {server.get('n_gen')}, exit {server.get('exit')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
