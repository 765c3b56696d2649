"""PFlash time to first token on one GPU against the target's own full prefill (run on the device machine from
the repository root, PYTHONPATH=.:scripts/device). SYNTHETIC: random weights and random token ids.

    python3 scripts/device/pflash_ttft.py --build DIR --drafter DIR --target PATH --out DIR \\
        [--lengths 32768,65536,131072] [--keep 0.05] [--kv bf16,q8_0,q4_0] [--llama-bench]

Per KV type: one lucebench-pflash process (target and drafter on the CUDA backend, keep ratio --keep, upstream's
32,000-token threshold) gets, per length L, a prompt of L random target ids and L random drafter ids over the
same "text" (token i spans characters [i, i + 1) in both tokenisations, so the bridge maps kept drafter chunks
to the same target positions). The first length runs twice (the first, a warm-up, is not reported). Recorded
per length: TTFT (the reply's prefill_ms: drafter forward, importance, selection, bridge, target prefill) and
every phase, tokens kept (drafter and target), the device bytes each model holds (engine-reported) and the
card's used memory (nvidia-smi, polled every 0.2 s during the request). Then lucebench-ar on the target
prefills the whole L-token prompt (our own full prefill) with the same KV type.

The drafter's attention cost: its forward time t(L) over the lengths fitted by t = a L + c L^2 (least squares);
c L^2 / t(L) at the longest length is the share of the quadratic (attention) term.
--llama-bench (the target a GGUF file, .cache/llamacpp carried): llama.cpp's llama-bench -p L -n 0 -fa 1 with the
matching -ctk/-ctv on the same file.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from engine_client import Engine


class MemPoll:
    """The card's used memory (MiB, nvidia-smi), its maximum over a window."""

    def __init__(self):
        self.peak, self._stop, self._t = 0, threading.Event(), None

    def __enter__(self):
        self.peak = 0
        self._stop.clear()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            try:
                r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                   capture_output=True, text=True, timeout=5)
                self.peak = max(self.peak, int(r.stdout.strip().splitlines()[0]))
            except Exception:  # noqa: BLE001
                pass
            self._stop.wait(0.2)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def prompt(length: int, t_vocab: int, d_vocab: int, seed: int) -> dict:
    rng = random.Random(seed)
    spans = [[i, i + 1] for i in range(length)]
    return {"prompt_ids": [rng.randrange(t_vocab) for _ in range(length)],
            "drafter_ids": [rng.randrange(d_vocab) for _ in range(length)],
            "drafter_offsets": spans, "target_offsets": spans}


def fit_quadratic(ls: list[int], ts: list[float]) -> dict:
    """t = a L + c L^2 by least squares (2x2 normal equations); the share of c L^2 at the longest L."""
    s11 = sum(x * x for x in ls)
    s12 = sum(x ** 3 for x in ls)
    s22 = sum(x ** 4 for x in ls)
    b1 = sum(x * t for x, t in zip(ls, ts))
    b2 = sum(x * x * t for x, t in zip(ls, ts))
    det = s11 * s22 - s12 * s12
    a, c = (b1 * s22 - b2 * s12) / det, (s11 * b2 - s12 * b1) / det
    L = max(ls)
    return {"a_ms_per_token": a, "c_ms_per_token2": c, "quadratic_share_at_longest": c * L * L / (a * L + c * L * L),
            "lengths": ls, "drafter_forward_ms": ts}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lengths", default="32768,65536,131072")
    ap.add_argument("--keep", type=float, default=0.05)
    ap.add_argument("--kv", default="bf16")
    ap.add_argument("--n-gen", type=int, default=4)
    ap.add_argument("--llama-bench", action="store_true")
    ap.add_argument("--engine-flags", default="", help="more flags for both engines (e.g. '--backend cpu' for a "
                                                       "dry run of this script on a CPU build)")
    ap.add_argument("--pflash-flags", default="", help="more flags for lucebench-pflash only")
    ap.add_argument("--no-full-prefill", action="store_true", help="skip lucebench-ar's full prefill of the target")
    ap.add_argument("--compare", type=Path, help="an earlier pflash_ttft.json (same prompts): the share of its kept "
                                                 "target positions this run keeps too, per length and KV type")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lengths = [int(x) for x in args.lengths.split(",")]
    max_ctx = max(lengths) + args.n_gen + 64
    res: dict = {"label": "SYNTHETIC (random weights, random token ids)", "target": str(args.target),
                 "drafter": str(args.drafter), "keep_ratio": args.keep, "lengths": lengths, "kv": {}}
    try:
        card = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        card = "no nvidia-smi"
    extra = args.engine_flags.split()
    res["card"] = card
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out_json = args.out / "pflash_ttft.json"

    def save():
        out_json.write_text(json.dumps(res, indent=1))

    for kv in args.kv.split(","):
        r = res["kv"][kv] = {"pflash": {}, "full_prefill": {}}
        pf = Engine(args.build / "lucebench-pflash", args.target, "--drafter", str(args.drafter), "--max-ctx",
                    str(max_ctx), "--keep-ratio", repr(args.keep), "--kv-k", kv, "--kv-v", kv, *extra,
                    *args.pflash_flags.split())
        try:
            t_vocab = pf.ready["model"]["vocab_size"]
            d_vocab = pf.ready["engine"]["options"]["drafter_model"]["vocab_size"]
            r["ready"] = {"model": pf.ready["model"], "options": pf.ready["engine"]["options"],
                          "tuning": pf.ready["engine"]["tuning"], "device": pf.ready["device"]}
            for i, L in enumerate([lengths[0]] + lengths):
                req = prompt(L, t_vocab, d_vocab, seed=L)
                with MemPoll() as mem:
                    t0 = time.monotonic()
                    rep = pf.gen(req["prompt_ids"], args.n_gen, ignore_eos=True,
                                 **{k: v for k, v in req.items() if k != "prompt_ids"})
                    wall = time.monotonic() - t0
                if i == 0:
                    print(f"[{kv}] warm-up at {L}: ttft {rep['timing']['prefill_ms']:.0f} ms", flush=True)
                    continue
                p = rep["prefill"]
                row = {"ttft_ms": rep["timing"]["prefill_ms"], "phases_ms": p["time_ms"],
                       "drafter_forward_ms": p["drafter_forward_ms"], "prompt_tokens": L,
                       "kept_tokens_drafter": p["kept_tokens_drafter"], "kept_tokens_target": p["kept_tokens_target"],
                       "kept_chunks": p["kept_chunks"], "forced_chunks": p["forced_chunks"], "n_chunks": p["n_chunks"],
                       "memory_bytes": p.get("memory_bytes"), "card_used_mib_peak": mem.peak,
                       "request_wall_s": round(wall, 2), "decode_ms": rep["timing"].get("decode_ms"),
                       "kept_ranges": p["kept_ranges"]}
                r["pflash"][str(L)] = row
                ph = p["time_ms"]
                print(f"[{kv}] pflash L={L}: TTFT {row['ttft_ms']:.0f} ms (drafter {p['drafter_forward_ms']:.0f}, "
                      f"score {ph['score']:.0f}, select {ph['select']:.1f}, bridge {ph['bridge']:.1f}, target prefill "
                      f"{ph['target_prefill']:.0f}); kept {row['kept_tokens_target']} target tokens; card "
                      f"{mem.peak} MiB used", flush=True)
                save()
        finally:
            pf.close()
        ls = [int(L) for L in r["pflash"]]
        if len(ls) >= 2:
            r["drafter_attention_fit"] = fit_quadratic(ls, [r["pflash"][str(L)]["drafter_forward_ms"]
                                                            for L in ls])
            f = r["drafter_attention_fit"]
            print(f"[{kv}] drafter forward t = {f['a_ms_per_token'] * 1e3:.2f} us L + {f['c_ms_per_token2'] * 1e9:.3f} "
                  f"ps L^2: quadratic share at {max(ls)} = {f['quadratic_share_at_longest']:.2f}", flush=True)
        if args.compare and args.compare.exists():
            other = json.loads(args.compare.read_text())["kv"].get(kv, {}).get("pflash", {})
            for L, row in r["pflash"].items():
                if L in other:
                    a = {p for x, y in other[L]["kept_ranges"] for p in range(x, y)}
                    b = {p for x, y in row["kept_ranges"] for p in range(x, y)}
                    row["kept_overlap_with_compare"] = len(a & b) / max(1, len(a))
                    print(f"[{kv}] L={L}: {row['kept_overlap_with_compare']:.3f} of {args.compare}'s kept positions "
                          f"kept here too", flush=True)
            save()
        if args.no_full_prefill:
            continue
        ar = Engine(args.build / "lucebench-ar", args.target, "--max-ctx", str(max_ctx), "--kv-k", kv, "--kv-v", kv,
                    *extra)
        try:
            t_vocab = ar.ready["model"]["vocab_size"]
            ar.gen(prompt(min(4096, lengths[0] // 2), t_vocab, 8, 1)["prompt_ids"], 1)  # warm-up
            for L in lengths:
                req = prompt(L, t_vocab, 8, seed=L)
                with MemPoll() as mem:
                    rep = ar.gen(req["prompt_ids"], 1, ignore_eos=True)
                row = {"prefill_ms": rep["timing"]["prefill_ms"], "card_used_mib_peak": mem.peak,
                       "tok_s": L / (rep["timing"]["prefill_ms"] / 1e3)}
                r["full_prefill"][str(L)] = row
                pfl = r["pflash"].get(str(L))
                if pfl:
                    pfl["speedup_vs_own_full_prefill"] = row["prefill_ms"] / pfl["ttft_ms"]
                print(f"[{kv}] own full prefill L={L}: {row['prefill_ms']:.0f} ms ({row['tok_s']:.0f} tok/s)"
                      + (f"; PFlash {pfl['speedup_vs_own_full_prefill']:.2f}x" if pfl else ""), flush=True)
                save()
        finally:
            ar.close()
        if args.llama_bench and args.target.suffix == ".gguf":
            try:
                r["llama_bench"] = llama_bench(args.target, lengths, kv, args.out)
                for L, ms in r["llama_bench"]["prefill_ms"].items():
                    if L in r["pflash"]:
                        r["pflash"][L]["speedup_vs_llamacpp"] = ms / r["pflash"][L]["ttft_ms"]
                print(f"[{kv}] llama.cpp full prefill: {r['llama_bench']['prefill_ms']}", flush=True)
            except Exception as e:  # noqa: BLE001
                r["llama_bench"] = {"error": repr(e)}
                print(f"[{kv}] llama-bench failed: {e!r}", flush=True)
            save()
    save()
    return 0


def llama_bench(gguf: Path, lengths: list[int], kv: str, out: Path) -> dict:
    from lucebench.baselines.llamacpp.bench import run_llama_bench
    from lucebench.baselines.llamacpp.build import build_llamacpp

    archive = Path(".cache/llamacpp/llama.cpp-0c1e570.tar.xz")
    t = time.time()
    build = build_llamacpp(backend="cuda", arch="90", source=archive)
    built = round(time.time() - t, 1)
    kvf = {"bf16": "bf16", "f16": "f16", "q8_0": "q8_0", "q4_0": "q4_0"}[kv]
    run = run_llama_bench(build, gguf, n_prompt=lengths, n_gen=[0], depth=[0], reps=1, flash_attn=True, kv_k=kvf,
                          kv_v=kvf, n_gpu_layers=999, stderr_path=out / f"llama-bench-{kv}.log")
    ms = {str(rec.n_prompt): min(rec.samples_ns) / 1e6 for rec in run.records if rec.n_prompt and rec.samples_ns}
    return {"argv": run.argv, "version": run.version, "build_seconds": built, "prefill_ms": ms}


if __name__ == "__main__":
    sys.exit(main())
