"""Long-context attention on CUDA, before and after the split forms (flash-decoding on the unfused GGUF decode
step, split-KV for a few rows): run on the device machine from the repository root (PYTHONPATH=.). All model
figures are on SYNTHETIC (random) weights: speed only; token comparisons are of two builds of one engine.

"Before" is the engines/ tree of BEFORE_COMMIT (default 9098bc0, where the splitkv branch started; set it to
the merge-base with main when this branch is merged into a newer main), from .carry/longctx/before/engines
when carried (and its COMMIT matches), else `git archive`; "after" is this tree. In parallel at the start: both CUDA builds and the
synthetic Qwen3.5-27B Q4_K_M GGUF. Then:
  1. lucebench-gpu-op-check (after): every op against its CPU reference; the attention_split and
     attention_decode rows printed (one row and 23 rows at 3K and 40K keys, hd 128 / 256, G 6 / 2, bf16 /
     q8_0 / q4_0 KV, a verify tree, the DFlash draft's block); then --time-attention: one attention layer of
     each long-context shape (27B decode step, 27B verify B = 22, the z-lab 27B draft's block, a 23-row
     chunk) at 256 .. 128K keys, the kernel it ran before against the path it takes now (~10 s);
  2. 27B `ar` decode after a random prompt of 1K, 16K, 64K and 128K tokens (32 tokens a run; the median of
     3 / 2 / 1 / 1 runs: each run prefills again), after;
  3. the 27B verify forward of a DDTree-like tree at B = 22 (23 rows) at contexts 256, 1K, 4K and 64K, and
     the decode step after it (lucebench-verify-gpu-check --time-verify, after; the single-pass tree
     attention the before build ran took 1,274 ms a verify at 64K on an H100, 2026-11-27);
  4. the same decode, before (1K, 16K, 64K, 128K; at 64K and 128K 16 tokens, ~11 / ~23 s at the issue's
     1.4 / 0.7 tok/s; 128K, ~64 s with its ~41 s prefill, only with BEFORE_128K_S (100) seconds left before
     DEADLINE_S, and not with LONGCTX_BEFORE_128K=0), each context's tokens compared with after's (first
     divergence over the shorter run; for prompts up to 16K the before build's relative top-2 margin there,
     so that a divergence at a near-tie reads as one).
Prints a table; writes $OUT/longctx/: check_longctx_gpu.json, table.md, op_check.md, attention_time.md,
verify_time.txt, build logs, engine-logs/. About 6-7 minutes on a fresh H100 (cold builds ~65 s, each
27B engine load ~19 s).
DEADLINE_S (default 470) only gates the before 128K run.
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
sys.path.insert(0, str(ROOT / "scripts" / "device"))
os.environ.setdefault("DEC_NAME", "longctx")
os.environ.setdefault("BEFORE_COMMIT", "9098bc0")
# its before tree and builds; it sets OUT to $OUT/longctx and imports check_quant_gpu (synth, start_guarded,
# first_divergence, rel_margin), pointed at that folder
import check_dec_gpu as cd  # noqa: E402
import check_quant_gpu as cq  # noqa: E402

OUT, R, T0, log = cd.OUT, cd.R, cd.T0, cd.log
ARCH, BEFORE_COMMIT = cd.ARCH, cd.BEFORE_COMMIT
AFTER_BUILD, BEFORE_BUILD = Path("/tmp/longctx-after-build"), Path("/tmp/longctx-before-build")
DEADLINE_S = float(os.environ.get("DEADLINE_S", "470"))
CONTEXTS = [1024, 16384, 65536, 131072]
REPS_AFTER = {1024: 3, 16384: 2, 65536: 1, 131072: 1}
REPS_BEFORE = {1024: 3, 16384: 1, 65536: 1, 131072: 1}
N_GEN = 32
N_GEN_BEFORE = {65536: 16, 131072: 16}  # the before build decodes at 1.4 / 0.7 tok/s there
GEN_TIMEOUT_S = 150.0  # one generation (the 128K prefill is ~41 s)
BEFORE_128K_S = 100.0  # the before build's 128K run (prefill ~41 s, 16 tokens at ~0.7 tok/s) needs about 64 s
MAX_CTX = 131072 + 2 * N_GEN
# the figures (H100 80GB HBM3, the same synthetic GGUF, `lucebench run configs/gpu-pflash-synthetic.yaml`,
# n_gen 8): llama.cpp's decode after the prompt, for the table
LLAMACPP_TOK_S = {16384: 54.0, 32768: 54.0, 65536: 48.5, 131072: 39.8}
R["n_gen"] = N_GEN
before_source = cd.before_source  # .carry/longctx/before/engines where its COMMIT matches, else git archive


def save() -> None:
    (OUT / "check_longctx_gpu.json").write_text(json.dumps(R, indent=1, default=str) + "\n")


def left() -> float:
    return DEADLINE_S - (time.time() - T0)


def build(src: Path, dst: Path, hash_: str, targets: list[str], jobs: int, key: str) -> None:
    cd.build(src, dst, hash_, targets, jobs, key)
    log(f"build {key} done in {R[f'build_{key}_s']} s")


def synth_27b(paths: dict) -> None:
    paths["27b"] = cq.synth("qwen3.5-27b")


def prompt_of(n: int) -> list[int]:
    V = 248320 - 300
    return [(i * 7919 + 13) % V + 100 for i in range(n)]


def op_check() -> None:
    rc = subprocess.run([str(AFTER_BUILD / "lucebench-gpu-op-check")], capture_output=True, text=True, timeout=400)
    (OUT / "op_check.md").write_text(rc.stdout + rc.stderr)
    rows = [ln for ln in rc.stdout.splitlines()
            if any(k in ln for k in ("attention_split", "attention_decode", "FAIL", "fail"))]
    print("\n".join(rows), flush=True)
    R["op_check"] = {"rc": rc.returncode, "summary": rc.stdout.strip().splitlines()[-1:], "rows": rows}
    log(f"op check (after): rc {rc.returncode}, {R['op_check']['summary']}")
    save()
    ta = subprocess.run([str(AFTER_BUILD / "lucebench-gpu-op-check"), "--time-attention"], capture_output=True,
                        text=True, timeout=180)
    (OUT / "attention_time.md").write_text(ta.stdout + ta.stderr)
    rows = [ln for ln in ta.stdout.splitlines() if ln.startswith("|")]
    print("\n".join(rows), flush=True)
    R["attention_time"] = {"rc": ta.returncode, "rows": rows}
    log(f"attention layer times (after build, before's kernel against the path now): rc {ta.returncode}")
    save()


def compare_tokens(e, L: int, before_ids: list[int]) -> None:
    """Before's tokens at prompt L against after's (over the shorter run); where they diverge (prompts up to 16K,
    time allowing) the before build's relative top-2 margin there, so that a near-tie reads as one."""
    a = R.get("decode_after", {}).get(str(L), {}).get("output_ids")
    if not a or not before_ids:
        return
    k = min(len(a), len(before_ids))
    a, b = a[:k], before_ids[:k]
    d = cq.first_divergence(a, b)
    row = {"identical": a == b, "first_divergence": d, "compared": k}
    if d is not None and L <= 16384 and left() > 60:
        lr = e.gen(prompt_of(L) + b[:d], 1, timeout_s=GEN_TIMEOUT_S, return_logits=True)
        row["before_rel_margin"] = cq.rel_margin(lr["last_logits"])
        row["near_tie"] = row["before_rel_margin"] < cq.NEAR_TIE
    R.setdefault("tokens", {})[str(L)] = row
    save()


def decode_runs(name: str, exe: Path, path: Path, contexts: list[int], reps: dict, n_gen: dict) -> None:
    """One engine process: for each context, `reps` runs of prompt + n_gen greedy tokens (each prefills again).
    The before build's 128K run (~64 s) starts only with BEFORE_128K_S seconds left before the deadline."""
    from engine_client import Engine

    t = time.time()
    e = Engine(exe, path, "--kv-k", "bf16", "--kv-v", "bf16", "--max-ctx", str(MAX_CTX))
    res = R.setdefault(f"decode_{name}", {})
    try:
        R[f"load_{name}_s"] = round(time.time() - t, 1)
        e.gen(prompt_of(64), 8, ignore_eos=True)  # warm-up (graph capture)
        for L in contexts:
            if name == "before" and L > 65536 and left() < BEFORE_128K_S:
                log(f"skipped before at {L}: {time.time() - T0:.0f} s gone")
                continue
            tok_s, prefill_s, ids = [], [], None
            for _ in range(reps[L]):
                r = e.gen(prompt_of(L), n_gen.get(L, N_GEN), timeout_s=GEN_TIMEOUT_S, ignore_eos=True)
                tok_s.append(r["decode_steps"] / (r["timing"]["decode_ms"] / 1e3))
                prefill_s.append(r["timing"]["prefill_ms"] / 1e3)
                ids = r["output_ids"]
            res[str(L)] = {"tok_s": tok_s, "median": statistics.median(tok_s), "prefill_s": prefill_s,
                           "output_ids": ids}
            log(f"27B Q4_K_M {name}, prompt {L}: decode {statistics.median(tok_s):.2f} tok/s (median of {reps[L]}: "
                f"{', '.join(f'{x:.2f}' for x in tok_s)}), prefill {statistics.median(prefill_s):.1f} s")
            save()
            if name == "before":
                compare_tokens(e, L, ids)
    finally:
        e.close()


def verify_time(contexts: str) -> None:
    name = "verify_time.txt"
    with (OUT / name).open("w") as f:
        rc = subprocess.run([str(AFTER_BUILD / "lucebench-verify-gpu-check"), "--time-verify", str(PATHS["27b"]),
                             contexts, "22"], stdout=f, stderr=subprocess.STDOUT, timeout=300).returncode
    txt = (OUT / name).read_text()
    rows = [ln for ln in txt.splitlines() if ln.startswith("| ") and ln[2:3].isdigit()]
    R["verify_time"] = {"rc": rc, "rows": rows}
    log(f"27B verify B = 22 (after build), rc {rc}:\n" + "\n".join(rows))
    save()
    if rc != 0:
        raise RuntimeError(f"lucebench-verify-gpu-check --time-verify exited {rc} (see {name})")


PATHS: dict = {}


def table() -> str:
    a, b = R.get("decode_after", {}), R.get("decode_before", {})
    lines = ["| prompt | before tok/s | after tok/s | x | llama.cpp (issue) | tokens after vs before |",
             "|---|---|---|---|---|---|"]
    for L in CONTEXTS:
        ra, rb = a.get(str(L), {}), b.get(str(L), {})
        ma, mb = ra.get("median"), rb.get("median")
        tk = R.get("tokens", {}).get(str(L))
        if tk is None:
            tks = "n/a"
        elif tk["identical"]:
            tks = f"identical ({tk['compared']} tokens)"
        else:
            tks = f"diverge at {tk['first_divergence']}"
            if "before_rel_margin" in tk:
                tks += f" (margin {tk['before_rel_margin']:.1e}{', near-tie' if tk['near_tie'] else ''})"
        lines.append(f"| {L} | {f'{mb:.2f}' if mb else 'not run'} | {f'{ma:.2f}' if ma else 'not run'} | "
                     f"{f'{ma / mb:.1f}' if ma and mb else '-'} | {LLAMACPP_TOK_S.get(L, '-')} | {tks} |")
    lines += ["", "| verify context | B | verify ms | decode step ms | verify / step |", "|---|---|---|---|---|"]
    for r in R.get("verify_time", {}).get("rows", []):
        c = [x.strip() for x in r.split("|")]
        if len(c) > 6:
            lines.append(f"| {c[1]} | {c[2]} | {c[5]} | {c[6]} | {float(c[5]) / float(c[6]):.2f} |")
    return "\n".join(lines)


def main() -> int:
    log(f"card: {cq.record_card()}; before = {BEFORE_COMMIT}")
    errors: list[str] = []

    def guarded(fn, *a):
        return cq.start_guarded(errors, fn, *a)

    try:
        src = before_source()
    except (OSError, subprocess.CalledProcessError) as exc:
        log(f"FAILED: no before tree (carry .carry/longctx/before/engines, or run in a git checkout): {exc!r}")
        return 1
    nproc = os.cpu_count() or 16
    after_th = guarded(build, ROOT / "engines", AFTER_BUILD, "longctx",
                       ["lucebench-ar", "lucebench-gpu-op-check", "lucebench-verify-gpu-check"],
                       max(2, nproc * 5 // 8), "after")
    before_th = guarded(build, src, BEFORE_BUILD, "before", ["lucebench-ar"], max(2, nproc * 3 // 8), "before")
    synth_th = guarded(synth_27b, PATHS)
    after_th.join()
    if errors:
        log("FAILED: " + "; ".join(errors))
        return 1
    op_check()  # while the before build and the synthesis go on (CPU only)
    synth_th.join()
    if errors:
        log("FAILED: " + "; ".join(errors))
        return 1
    steps = [("decode after", lambda: decode_runs("after", AFTER_BUILD / "lucebench-ar", PATHS["27b"], CONTEXTS,
                                                   REPS_AFTER, {})),
             ("verify", lambda: verify_time("256,1024,4096,65536"))]
    for what, fn in steps:
        try:
            fn()
        except Exception as exc:
            errors.append(f"{what}: {exc!r}")
            log(f"FAILED {what}: {exc!r}")
    before_th.join()
    before_ctx = CONTEXTS if os.environ.get("LONGCTX_BEFORE_128K", "1") != "0" else CONTEXTS[:3]
    if not (BEFORE_BUILD / "lucebench-ar").is_file():
        errors.append("no before build")
        log("FAILED: no before build: " + "; ".join(errors))
    else:
        try:
            decode_runs("before", BEFORE_BUILD / "lucebench-ar", PATHS["27b"], before_ctx, REPS_BEFORE, N_GEN_BEFORE)
        except Exception as exc:
            errors.append(f"decode before: {exc!r}")
            log(f"FAILED decode before: {exc!r}")
    R["errors"] = errors
    R["wall_s"] = round(time.time() - T0, 1)
    save()
    t = table()
    (OUT / "table.md").write_text(t + "\n")
    print(f"\nSUMMARY ({R['card'].split(',')[0]}, {R['date_utc']} UTC, SYNTHETIC 27B Q4_K_M GGUF, bf16 KV, "
          f"{N_GEN} tokens a run, before at 64K+ {N_GEN_BEFORE[65536]}; before = {BEFORE_COMMIT}): op check rc {R.get('op_check', {}).get('rc')}, "
          f"{R.get('op_check', {}).get('summary')}; errors {errors}; {time.time() - T0:.0f} s\n{t}", flush=True)
    ok = not errors and R.get("op_check", {}).get("rc") == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
