"""PFlash time to first token on one GPU against the target's own full prefill and llama.cpp's (run on the
device machine from the repository root, PYTHONPATH=.:scripts/device). SYNTHETIC: random weights and random
token ids (--label says so in the result).

    python3 scripts/device/pflash_ttft.py --build DIR --drafter DIR --target PATH --out DIR \\
        [--lengths 32768,65536,131072] [--warmup-length N] [--keep 0.05] [--kv bf16,q8_0,q4_0] \\
        [--llama-bench [--llama-ubatch 2048]] [--deadline-s S]

Per KV type: one lucebench-pflash process (target and drafter on the CUDA backend, keep ratio --keep, upstream's
32,000-token threshold) gets, per length L, a prompt of L random target ids and L random drafter ids over the
same "text" (token i spans characters [i, i + 1) in both tokenisations, so the bridge maps kept drafter chunks
to the same target positions). A warm-up request (--warmup-length, default the first length) is not reported.
Recorded per length: TTFT (the reply's prefill_ms: drafter forward, importance, selection, bridge, target
prefill) and every phase, tokens kept (drafter and target), the device bytes each model holds (engine-reported)
and the card's used memory (nvidia-smi, polled every 0.2 s during the request). Then the full prefills of the
whole L-token prompt with the same KV type: ours (lucebench-ar on the target) and, with --llama-bench and a
.gguf target (.cache/llamacpp carried), llama.cpp's: llama-bench -p L -n 0 -r 1 --no-warmup -fa 1 -ctk/-ctv
the same type, -ngl 999, -b/-ub --llama-ubatch, one run per length. llama.cpp's CUDA build starts at once in a
niced background process (minutes on a fresh machine; a cache hit on a warm one) and each llama-bench run
starts as soon as it is ready, the longest length first.

--deadline-s S: everything within S seconds. A PFlash length whose estimate (the previous request's time times
the length ratio to the power 1.5: the drafter's attention is quadratic, the rest linear) does not fit is
skipped; our full prefill of a length gets the time left minus what the pending llama-bench runs are expected
to need (L / 2000 tok/s + 30 s each), a llama-bench run the time left; a run killed at its limit is recorded
as a lower bound. Skips are listed in the result's "skipped".

The drafter's attention cost: its forward time t(L) over the lengths fitted by t = a L + c L^2 (least squares);
c L^2 / t(L) at the longest length is the share of the quadratic (attention) term. The drafter's attention is
the engine's default, block-sparse from 32,768 tokens (alpha 0.85, budget 0.1), unless --pflash-flags says
otherwise (--pflash-flags="--drafter-sparse-from 0": dense); the ready line's options in the result record it.
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

from engine_client import TIMEOUT_S, Engine

from lucebench.errors import EngineError


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


class Deadline:
    """Seconds left before --deadline-s (from this script's start); inf without a deadline."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds if seconds > 0 else None

    def left(self) -> float:
        return float("inf") if self.end is None else self.end - time.monotonic()


class LlamaBuild:
    """llama.cpp's pinned CUDA build in a niced child process, started at once so our measurements overlap it
    (its cache is keyed and locked: a finished build, or one an earlier call left running, is picked up)."""

    def __init__(self, archive: Path, out: Path, arch: str):
        self.result = out / "llamacpp_build.json"
        self.proc: subprocess.Popen | None = None
        self.t0 = time.monotonic()
        self.error = None if archive.exists() else f"missing {archive}: carry .cache/llamacpp"
        if self.error:
            return
        code = ("import json; from lucebench.baselines.llamacpp.build import build_llamacpp; "
                f"b = build_llamacpp(backend='cuda', arch='{arch}', source='{archive}'); "
                f"open('{self.result}', 'w').write(json.dumps(b.to_dict(), default=str))")
        self.proc = subprocess.Popen(["nice", "-n", "15", sys.executable, "-c", code],
                                     stdout=(out / "llamacpp_build.log").open("w"), stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is None:
            return False
        if self.proc.returncode != 0:
            self.error, self.proc = "build failed: see llamacpp_build.log", None
            return False
        return True

    def wait(self, seconds: float) -> bool:
        if self.proc is not None and seconds > 0:
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                pass
        return self.ready()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lengths", default="32768,65536,131072")
    ap.add_argument("--warmup-length", type=int, default=0,
                    help="the PFlash warm-up request's length (default: the first length; at least 32000, "
                         "upstream's threshold, so that the drafter runs)")
    ap.add_argument("--keep", type=float, default=0.05)
    ap.add_argument("--kv", default="bf16")
    ap.add_argument("--n-gen", type=int, default=4)
    ap.add_argument("--label", default="SYNTHETIC (random weights, random token ids)")
    ap.add_argument("--llama-bench", action="store_true")
    ap.add_argument("--llama-ubatch", type=int, default=2048,
                    help="llama-bench -b and -ub (0: llama-bench's defaults, 2048 / 512)")
    ap.add_argument("--deadline-s", type=float, default=0,
                    help="finish within this many seconds: a step that would start too late is skipped (and said "
                         "so); a full prefill still going at its limit is killed and recorded as a lower bound")
    ap.add_argument("--engine-flags", default="", help="more flags for both engines (e.g. '--backend cpu' for a "
                                                       "dry run of this script on a CPU build)")
    ap.add_argument("--pflash-flags", default="", help="more flags for lucebench-pflash only")
    ap.add_argument("--no-full-prefill", action="store_true", help="skip lucebench-ar's full prefill of the target")
    ap.add_argument("--compare", type=Path, help="an earlier pflash_ttft.json (same prompts): the share of its kept "
                                                 "target positions this run keeps too, per length and KV type")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = Deadline(args.deadline_s)
    lengths = [int(x) for x in args.lengths.split(",")]
    warm_len = args.warmup_length or lengths[0]
    max_ctx = max(lengths + [warm_len]) + args.n_gen + 64
    res: dict = {"label": args.label, "target": str(args.target), "drafter": str(args.drafter),
                 "keep_ratio": args.keep, "lengths": lengths, "kv": {}, "skipped": []}
    try:
        card = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        card = "no nvidia-smi"
    extra = args.engine_flags.split()
    res["card"] = card
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out_json = args.out / "pflash_ttft.json"
    llama = None
    if args.llama_bench and args.target.suffix == ".gguf":
        llama = LlamaBuild(Path(".cache/llamacpp/llama.cpp-0c1e570.tar.xz"), args.out, "90")

    def save():
        out_json.write_text(json.dumps(res, indent=1))

    def skip(what: str) -> None:
        res["skipped"].append(what)
        print(f"skipped {what}", flush=True)
        save()

    for kv in args.kv.split(","):
        r = res["kv"][kv] = {"pflash": {}, "full_prefill": {}}
        t_load = time.monotonic()
        pf = Engine(args.build / "lucebench-pflash", args.target, "--drafter", str(args.drafter), "--max-ctx",
                    str(max_ctx), "--keep-ratio", repr(args.keep), "--kv-k", kv, "--kv-v", kv, *extra,
                    *args.pflash_flags.split())
        r["pflash_load_s"] = round(time.monotonic() - t_load, 1)
        try:
            t_vocab = pf.ready["model"]["vocab_size"]
            d_vocab = pf.ready["engine"]["options"]["drafter_model"]["vocab_size"]
            r["ready"] = {"model": pf.ready["model"], "options": pf.ready["engine"]["options"],
                          "tuning": pf.ready["engine"]["tuning"], "device": pf.ready["device"]}
            prev = None  # (length, request wall s) of the last request: the next one's estimate, x (L / l)^1.5
            for i, L in enumerate([warm_len] + lengths):
                est = prev[1] * (L / prev[0]) ** 1.5 if prev else 0.0
                if i > 0 and est > deadline.left():
                    skip(f"[{kv}] pflash L={L}: estimated {est:.0f} s, {deadline.left():.0f} s left")
                    continue
                req = prompt(L, t_vocab, d_vocab, seed=L)
                with MemPoll() as mem:
                    t0 = time.monotonic()
                    rep = pf.gen(req["prompt_ids"], args.n_gen, ignore_eos=True,
                                 **{k: v for k, v in req.items() if k != "prompt_ids"})
                    wall = time.monotonic() - t0
                prev = (L, wall)
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
                       "kept_ranges": p["kept_ranges"],
                       # block-sparse drafter: the share of the causal key tiles its attention read
                       "drafter_attention_read": p.get("drafter_attention_read")}
                r["pflash"][str(L)] = row
                ph = p["time_ms"]
                print(f"[{kv}] pflash L={L}: TTFT {row['ttft_ms']:.0f} ms (drafter {p['drafter_forward_ms']:.0f}, "
                      f"score {ph['score']:.0f}, select {ph['select']:.1f}, bridge {ph['bridge']:.1f}, target prefill "
                      f"{ph['target_prefill']:.0f}); kept {row['kept_tokens_target']} target tokens; "
                      + (f"drafter attention read {row['drafter_attention_read']:.3f} of its key tiles; "
                         if row["drafter_attention_read"] is not None else "") + f"card "
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
        full_prefills(args, r, kv, lengths, max_ctx, extra, deadline, llama, skip, save)
    save()
    print(summary(res), flush=True)
    return 0


def summary(res: dict) -> str:
    """The result as a table: per KV type and length, TTFT and the full prefills (ms) and the ratios."""
    rows = [f"{res['label']}; {res['card']}; {res['date']}; keep {res['keep_ratio']}",
            "| KV | L | PFlash TTFT ms | kept (target) | own full prefill ms | x | llama.cpp full prefill ms | x |",
            "|---|---|---|---|---|---|---|---|"]
    for kv, r in res["kv"].items():
        for L in sorted({int(x) for x in list(r["pflash"]) + list(r["full_prefill"])}):
            p = r["pflash"].get(str(L), {})
            f = r["full_prefill"].get(str(L), {})
            ll = r.get("llama_bench", {}).get("prefill_ms", {}).get(str(L))
            own = f"{f['prefill_ms']:.0f}" if "prefill_ms" in f else (f">{f['at_least_ms']:.0f}" if f else "-")
            def num(x, spec: str) -> str:
                return "-" if x is None else format(x, spec)

            rows.append(f"| {kv} | {L} | {num(p.get('ttft_ms'), '.0f')} | {p.get('kept_tokens_target', '-')} | {own} | "
                        f"{num(p.get('speedup_vs_own_full_prefill'), '.2f')} | {num(ll, '.0f')} | "
                        f"{num(p.get('speedup_vs_llamacpp'), '.2f')} |")
    rows += [f"skipped: {s}" for s in res["skipped"]]
    return "\n".join(rows)


def llama_estimate_s(L: int) -> float:
    """What a pending llama-bench run is expected to need (load + prefill at 2,000 tok/s): time kept for it."""
    return L / 2000 + 30


def full_prefills(args, r: dict, kv: str, lengths: list[int], max_ctx: int, extra: list[str], deadline: Deadline,
                  llama: LlamaBuild | None, skip, save) -> None:
    """The full-prefill baselines after PFlash: ours (lucebench-ar) and llama.cpp's (llama-bench), each the
    longest length first (the headline ratio), each llama.cpp run as soon as its build is ready. Ours
    get the time left minus llama_estimate_s of each pending llama.cpp run; one cut off at that limit is
    recorded as a lower bound (at_least_ms)."""
    ours = [] if args.no_full_prefill else sorted(lengths, reverse=True)
    theirs = sorted(lengths, reverse=True) if llama is not None else []
    if llama is not None and llama.error:
        r["llama_bench"] = {"error": llama.error}
        theirs = []
    ar = None

    def reserve() -> float:
        return sum(llama_estimate_s(L) for L in theirs)

    try:
        while ours or theirs:
            if theirs and llama.ready():
                if ar is not None:  # the card to llama.cpp alone
                    ar.close()
                    ar = None
                llama_row(args, r, kv, theirs.pop(0), deadline, llama)
                save()
                continue
            if ours:
                L = ours.pop(0)
                limit = min(TIMEOUT_S, deadline.left() - reserve())
                if limit < 30:
                    skip(f"[{kv}] own full prefill L={L}: {deadline.left():.0f} s left, {reserve():.0f} s kept for "
                         f"llama.cpp")
                    continue
                if ar is None:
                    t = time.monotonic()
                    ar = Engine(args.build / "lucebench-ar", args.target, "--max-ctx", str(max_ctx), "--kv-k", kv,
                                "--kv-v", kv, *extra)
                    r["full_prefill_load_s"] = round(time.monotonic() - t, 1)
                    ar.gen(prompt(min(4096, min(lengths) // 2), ar.ready["model"]["vocab_size"], 8, 1)["prompt_ids"], 1)
                    limit = min(TIMEOUT_S, deadline.left() - reserve())
                req = prompt(L, ar.ready["model"]["vocab_size"], 8, seed=L)
                pfl = r["pflash"].get(str(L))
                t0 = time.monotonic()
                try:
                    with MemPoll() as mem:
                        rep = ar.gen(req["prompt_ids"], 1, timeout_s=max(1.0, limit), ignore_eos=True)
                except EngineError as e:
                    if e.kind != "timeout":
                        raise
                    ar.close()
                    ar = None
                    ms = (time.monotonic() - t0) * 1e3
                    r["full_prefill"][str(L)] = {"at_least_ms": ms, "note": "killed at the time limit"}
                    print(f"[{kv}] own full prefill L={L}: killed after {ms / 1e3:.0f} s (it takes longer)", flush=True)
                    save()
                    continue
                row = {"prefill_ms": rep["timing"]["prefill_ms"], "card_used_mib_peak": mem.peak,
                       "tok_s": L / (rep["timing"]["prefill_ms"] / 1e3)}
                r["full_prefill"][str(L)] = row
                if pfl:
                    pfl["speedup_vs_own_full_prefill"] = row["prefill_ms"] / pfl["ttft_ms"]
                print(f"[{kv}] own full prefill L={L}: {row['prefill_ms']:.0f} ms ({row['tok_s']:.0f} tok/s)"
                      + (f"; PFlash {pfl['speedup_vs_own_full_prefill']:.2f}x" if pfl else ""), flush=True)
                save()
                continue
            # only llama.cpp runs left, its build still going: wait for it while the shortest can still run
            assert llama is not None
            if not llama.wait(deadline.left() - min(llama_estimate_s(L) for L in theirs)):
                why = llama.error or f"llama.cpp's build not finished after {time.monotonic() - llama.t0:.0f} s"
                for L in theirs:
                    skip(f"[{kv}] llama-bench L={L}: {why}")
                r.setdefault("llama_bench", {})["error"] = why
                theirs = []
    finally:
        if ar is not None:
            ar.close()


def llama_row(args, r: dict, kv: str, L: int, deadline: Deadline, llama: LlamaBuild) -> None:
    """llama.cpp's full prefill of L tokens on the same GGUF: llama-bench -p L -n 0 -r 1 --no-warmup (its
    warm-up would prefill the whole prompt a second time), flash attention on, the same KV type, every layer
    on the GPU, -b and -ub --llama-ubatch."""
    from lucebench.baselines.llamacpp.bench import run_llama_bench
    from lucebench.baselines.llamacpp.build import LlamaCppBuild

    lb = r.setdefault("llama_bench", {})
    lb.setdefault("prefill_ms", {})
    lb.setdefault("runs", {})
    lb["build"] = json.loads(llama.result.read_text())
    build = LlamaCppBuild.from_dict(lb["build"])
    kvf = {"bf16": "bf16", "f16": "f16", "q8_0": "q8_0", "q4_0": "q4_0"}[kv]
    more = ["--no-warmup"] + (["-b", str(args.llama_ubatch), "-ub", str(args.llama_ubatch)] if args.llama_ubatch else [])
    limit = deadline.left() - 5
    if limit < 20:
        lb["runs"][str(L)] = {"skipped": f"{deadline.left():.0f} s left"}
        print(f"[{kv}] llama-bench L={L}: skipped, {deadline.left():.0f} s left", flush=True)
        return
    t0 = time.monotonic()
    try:
        run = run_llama_bench(build, args.target, n_prompt=[L], n_gen=[0], depth=[0], reps=1, flash_attn=True,
                              kv_k=kvf, kv_v=kvf, n_gpu_layers=999, stderr_path=args.out / f"llama-bench-{kv}-{L}.log",
                              timeout_s=min(limit, 900.0), extra=more)
    except EngineError as e:
        s = time.monotonic() - t0
        lb["runs"][str(L)] = {"error": str(e), "kind": e.kind, "seconds": round(s, 1)}
        if e.kind == "timeout":  # load included: a bound on load + prefill, not the prefill alone
            lb["runs"][str(L)]["note"] = f"killed after {s:.0f} s (model load + prefill)"
        print(f"[{kv}] llama-bench L={L}: {e.kind} after {s:.0f} s: {e}", flush=True)
        return
    ms = [min(rec.samples_ns) / 1e6 for rec in run.records if rec.n_prompt == L and rec.samples_ns]
    lb["runs"][str(L)] = {"argv": run.argv, "version": run.version, "seconds": run.seconds}
    if not ms:
        return
    lb["prefill_ms"][str(L)] = ms[0]
    pfl = r["pflash"].get(str(L))
    if pfl:
        pfl["speedup_vs_llamacpp"] = ms[0] / pfl["ttft_ms"]
    print(f"[{kv}] llama.cpp full prefill L={L}: {ms[0]:.0f} ms ({L / ms[0] * 1e3:.0f} tok/s)"
          + (f"; PFlash {pfl['speedup_vs_llamacpp']:.2f}x" if pfl else "") + f"  ({' '.join(run.argv)})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
