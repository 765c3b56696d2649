"""The DFlash round's costs beside the verify's GEMMs (the commit, the draft forward, the host loop), before
against after on one card (run on the device machine from the repository root, PYTHONPATH=.). All model
figures are on SYNTHETIC (random) weights, with a benchmark-only forced acceptance: speed only.

"Before" is .carry/dstep/before/engines (main's engines tree; its commit in .carry/dstep/before/COMMIT),
"after" this tree. In parallel at the start: both CUDA builds, the synthetic GGUF of Qwen3.5-27B (Q4_K_M as
llama.cpp's recipe types it) with a random z-lab-shaped draft, the synthetic 0.8B with a random draft, the
CUPTI injection library. Then:
  1. lucebench-verify-kernels-check (after): every verify kernel against its CPU reference, and the commit of
     all layers in one launch against the CPU references and, bitwise, against the one-row-a-block kernel;
  2. lucebench-verify-gpu-check (after): GPU verify + commit == AR (scripted trees);
  3. lucebench-dflash-gpu-check (after): the GPU draft's kernels (draft_top_k among them) and forward against
     DraftModelCpu; lucebench-gemm-bench --draft: the draft's matrices at 8 / 9 / 16 rows and the LM head at
     15, alone (ms, GB/s of W);
  4. DFlash lossless on the synthetic 0.8B (after): dflash greedy tokens == ar's, chain and budgets 8 / 22,
     KV bf16 and q8_0 (check_dflash_gpu.py's lossless: a divergence passes only at a near-tie of ar);
  5. forced AL 8.31 on the synthetic 27B Q4_K_M, budgets 8 and 22, prompt 64, n_gen 256, 1 warm-up + 2 reps
     (the faster kept): ar (after) and dflash before / after, with draft / tree / verify / commit ms a round;
     the output tokens of before and after compared, and the logits after a 164-token prompt (a chain
     verify of 163 rows, its commit, a one-row verify) bitwise: verify and commit keep their arithmetic and
     the draft's is unchanged, so both must be identical;
  6. the CUPTI breakdown of a round (budget 8, after; as time allows the before build's round, then the
     verify's cost per row count, lucebench-verify-gpu-check --time-model): kernels on the GPU clock
     split into draft (its block embed .. draft_top_k), verify (embed .. argmax_rows) and commit (the rest:
     KV / DeltaNet / conv commit, the draft's context rows), per phase the GPU time, the span and the
     kernels; the idle time between phases is the host's (tree, walk, waits).
Writes $OUT/dstep/: check_dstep_gpu.json, *.txt of the checks, speed.md, timeline_{after,before}.md/.csv,
build logs. About 6 minutes on an H100.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "device"))
OUT = Path(os.environ.get("OUT", "/tmp/out")) / "dstep"
OUT.mkdir(parents=True, exist_ok=True)
import check_dflash_gpu as cdg  # noqa: E402  (the lossless check)
import check_quant_gpu as cq  # noqa: E402  (synthetic GGUF, CUPTI library; it points OUT at .../gq)

os.environ["OUT"] = str(OUT)  # engine_client's logs
cq.OUT = OUT
ARCH = os.environ.get("ARCH", "90")
AFTER, BEFORE = Path("/tmp/dstep-after"), Path("/tmp/dstep-before")
DEADLINE_S = float(os.environ.get("DEADLINE_S", "420"))  # the before timeline only if it can end by then
SYNTH_08B, DRAFT_08B = Path("/tmp/qwen35-0.8b-synth"), Path("/tmp/dflash-0.8b-synth-draft")
FORCED_AL, N_GEN = 8.31, 256
T0 = time.time()
R: dict = {"label": "SYNTHETIC weights (random), forced acceptance: speed figures only"}
errors: list[str] = []


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save() -> None:
    (OUT / "check_dstep_gpu.json").write_text(json.dumps(R, indent=1, default=str) + "\n")


def guarded(fn, *a) -> threading.Thread:
    return cq.start_guarded(errors, fn, *a)


def build(src: Path, dst: Path, targets: list[str], jobs: int, key: str) -> None:
    R[f"build_{key}_s"] = cq.cmake_build(src, dst, targets, jobs, OUT / f"build_{key}.log")


def synth_27b(paths: dict) -> None:
    paths["27b"] = cq.synth("qwen3.5-27b")
    paths["draft27"] = cq.synth_draft("qwen3.5-27b")


def synth_08b() -> None:
    cq.synth_08b_checkpoint(OUT / "synth_08b.log")
    from lucebench.models.dflash_draft import synthesize_draft

    if not (DRAFT_08B / "config.json").is_file():
        synthesize_draft(SYNTH_08B, DRAFT_08B, seed=1)


def check_binary(name: str, args: list[str], show, tail: int = 6) -> int:
    """One check binary of the after build: its FAIL lines, the lines `show` picks and its last `tail` lines."""
    t = time.time()
    try:
        p = subprocess.run([str(AFTER / name), *args], capture_output=True, text=True, timeout=240)
        txt, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:
        txt, rc = f"timed out: {exc!r}", 124
    (OUT / f"{name}.txt").write_text(txt)
    all_lines = txt.splitlines()
    lines = [ln for ln in all_lines[:-tail] if show(ln) or "FAIL" in ln] + all_lines[-tail:]
    R[name] = {"rc": rc, "lines": lines, "s": round(time.time() - t, 1)}
    log(f"{name} (after): rc {rc} ({time.time() - t:.0f} s)\n" + "\n".join(lines))
    if rc:
        errors.append(f"{name} rc {rc}")
    save()
    return rc


def gemm_draft() -> None:
    """The draft's bf16 matrices at 8 / 9 / 16 rows and the q6_K LM head at 15 rows, alone: GB/s of W."""
    p = subprocess.run([str(AFTER / "lucebench-gemm-bench"), "--draft"], capture_output=True, text=True, timeout=120)
    (OUT / "gemm_draft.md").write_text(p.stdout + p.stderr)
    R["gemm_draft"] = p.stdout
    log(f"the round's small-n matrices alone (lucebench-gemm-bench --draft, rc {p.returncode}):\n{p.stdout.strip()}")
    save()


def lossless_08b() -> None:
    exe = {"ar": AFTER / "lucebench-ar", "dflash": AFTER / "lucebench-dflash"}
    rng = random.Random(0)
    prompts = [[rng.randrange(248000) for _ in range(n)] for n in (5, 40, 300)]
    rows = cdg.lossless("SYNTHETIC 0.8B", exe, SYNTH_08B, DRAFT_08B, prompts, 48, ["chain", "tree8", "tree22"],
                        ["bf16", "q8_0"], [], 512)
    R["lossless_08b"] = [{k: v for k, v in r.items() if k != "output_ids"} for r in rows]
    if cdg.failures:
        errors.append("lossless 0.8B: " + " | ".join(cdg.failures))
    log(f"DFlash lossless, SYNTHETIC 0.8B (after): {sum(r['lossless'] for r in rows)}/{len(rows)} identical to ar, "
        f"{'FAILED: ' + ' | '.join(cdg.failures) if cdg.failures else 'ok (divergences only at near-ties)'}")
    save()


def speed(paths: dict) -> None:
    from engine_client import Engine

    target, draft = paths["27b"], paths["draft27"]
    flags = ["--max-ctx", "1024"]
    ar = Engine(AFTER / "lucebench-ar", target, *flags)
    vocab = int(ar.ready["model"]["vocab_size"])
    rng = random.Random(1)
    prompt = [rng.randrange(vocab // 8, vocab // 2) for _ in range(64)]
    R["prompt_27b"] = prompt
    ar.gen(prompt, N_GEN, ignore_eos=True)
    rs = [ar.gen(prompt, N_GEN, ignore_eos=True) for _ in range(2)]
    ar.close()
    ar_tps = max((len(r["output_ids"]) - 1) / r["timing"]["decode_ms"] * 1e3 for r in rs)
    ar_ms = 1e3 / ar_tps
    R["ar_27b"] = {"tok_s": ar_tps, "step_ms": ar_ms}
    lines = [f"ar (after): {ar_tps:.1f} tok/s ({ar_ms:.3f} ms a step)",
             "| budget | build | AL | tok/s | x ar | round ms | draft ms | tree ms | verify ms | commit ms | = before |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = {}
    for b in (8, 22):
        for key, build_dir in (("before", BEFORE), ("after", AFTER)):
            e = Engine(build_dir / "lucebench-dflash", target, "--draft", str(draft), *flags, "--budget", str(b),
                       "--force-accept-length", str(FORCED_AL))
            e.gen(prompt, N_GEN, ignore_eos=True)  # warm-up
            rs = [e.gen(prompt, N_GEN, ignore_eos=True) for _ in range(2)]
            # the logits after a 164-token prompt (prefill: a chain verify of 163 rows, its commit, a one-row
            # verify): bitwise the same in both builds when verify and commit keep their arithmetic
            lg = e.gen(prompt + rs[0]["output_ids"][:100], 1, return_logits=True)["last_logits"]
            e.close()
            best = max(rs, key=lambda r: (len(r["output_ids"]) - 1) / r["timing"]["decode_ms"])
            sp = best["spec"]
            steps = sp["draft_steps"]
            per = {k: v / steps for k, v in sp["time_ms"].items()}
            tps = (len(best["output_ids"]) - 1) / best["timing"]["decode_ms"] * 1e3
            rows[(b, key)] = {"al": sp["acceptance_length"], "tok_s": tps, "per_round_ms": per,
                              "round_ms": best["timing"]["decode_ms"] / steps, "output_ids": best["output_ids"],
                              "logits": lg,
                              "runs_tok_s": [(len(r["output_ids"]) - 1) / r["timing"]["decode_ms"] * 1e3 for r in rs]}
            same = ""
            if key == "after":
                ref = rows[(b, "before")]
                d = cdg.first_divergence(best["output_ids"], ref["output_ids"])
                diff = max((abs(x - y) for x, y in zip(lg, ref["logits"])), default=float("inf"))
                same = ("tokens " + ("identical" if d is None else f"DIFFER at {d}") + "; logits " +
                        ("bitwise" if lg == ref["logits"] else f"DIFFER (max abs {diff:.2e})"))
                if d is not None or lg != ref["logits"]:
                    errors.append(f"forced AL budget {b}: after differs from before ({same})")
            r = rows[(b, key)]
            lines.append(f"| {b} | {key} | {r['al']:.2f} | {tps:.1f} | {tps / ar_tps:.2f} | {r['round_ms']:.3f} | "
                         f"{per['draft']:.3f} | {per['tree']:.3f} | {per['verify']:.3f} | {per['commit']:.3f} | {same} |")
            R["speed"] = {f"{k[0]}_{k[1]}": {kk: vv for kk, vv in v.items() if kk not in ("output_ids", "logits")}
                          for k, v in rows.items()}
            save()
    (OUT / "speed.md").write_text("\n".join(lines) + "\n")
    log("SYNTHETIC 27B Q4_K_M, forced AL 8.31, prompt 64, n_gen 256:\n" + "\n".join(lines))


def verify_time(paths: dict) -> None:
    """lucebench-verify-gpu-check --time-model on the 27B (after): the verify of B + 1 rows against a decode
    step, and one DeltaNet layer's delta_tree alone."""
    p = subprocess.run([str(AFTER / "lucebench-verify-gpu-check"), "--time-model", str(paths["27b"])],
                       capture_output=True, text=True, timeout=150)
    (OUT / "verify_time_27b.txt").write_text(p.stdout + p.stderr)
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("|") or "decode step" in ln or "delta_tree" in ln]
    R["verify_time_27b"] = rows
    log("27B Q4_K_M verify cost (after, lucebench-verify-gpu-check --time-model):\n" + "\n".join(rows))
    save()


def phase_split(rows: list[dict]) -> list[dict]:
    """Kernel records (sorted by start) -> rounds: {"draft": [...], "verify": [...], "commit": [...]}. A round
    starts at the embed of the draft's block (the first embed after a commit) and its draft ends at
    draft_top_k; the verify runs from the next embed to argmax_rows; the commit is what follows."""
    rounds, cur, phase = [], None, "commit"
    for k in rows:
        name = k["name"]
        if phase == "commit" and name.startswith("embed"):
            cur = {"draft": [], "verify": [], "commit": []}
            rounds.append(cur)
            phase = "draft"
        if cur is None:
            continue  # the prefill's first verify
        if phase == "draft-done" and name.startswith("embed"):
            phase = "verify"
        cur["draft" if phase == "draft-done" else phase].append(k)
        if phase == "draft" and name.startswith("draft_top_k"):
            phase = "draft-done"
        elif phase == "verify" and name.startswith("argmax_rows"):
            phase = "commit"
    return rounds


def timeline(paths: dict, build_dir: Path, key: str) -> None:
    """A DFlash round's kernels on the GPU clock (CUPTI), budget 8, forced AL 8.31, split into its phases."""
    if cq.R.get("timeline_lib") != "ok":
        log(f"timeline skipped: {cq.R.get('timeline_lib')}")
        return
    from engine_client import Engine
    from timeline_decode import short

    csv_path = OUT / f"timeline_{key}.csv"
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(cq.TIMELINE_LIB), LB_TIMELINE_OUT=str(csv_path))
    e = Engine(build_dir / "lucebench-dflash", paths["27b"], "--draft", str(paths["draft27"]), "--max-ctx", "1024",
               "--budget", "8", "--force-accept-length", str(FORCED_AL), env=env)
    e.gen(R["prompt_27b"], 64, ignore_eos=True)
    r = e.gen(R["prompt_27b"], 160, ignore_eos=True)
    e.close()
    import csv as csvmod

    with open(csv_path) as f:
        recs = sorted(({"start": int(x["start_ns"]), "end": int(x["end_ns"]), "grid": int(x["grid"]),
                        "name": short(x["name"])} for x in csvmod.DictReader(f)), key=lambda x: x["start"])
    summarize(recs, r["spec"], key)


def summarize(recs: list[dict], sp: dict, key: str) -> None:
    """The rounds of the traced generation (its spec: rounds and host-timed phases) -> timeline_<key>.md."""
    host = {k: v / sp["draft_steps"] for k, v in sp["time_ms"].items()}
    rounds = phase_split(recs)
    # the last generation's rounds, whole ones (the next round's draft follows), less the first two
    rounds = [(a, b) for a, b in zip(rounds, rounds[1:]) if all(a[p] for p in ("draft", "verify", "commit"))]
    rounds = rounds[-(sp["draft_steps"] - 3):] if sp["draft_steps"] > 4 else rounds
    if not rounds:
        raise RuntimeError(f"no whole rounds in {len(recs)} kernel records")
    stats: dict[str, dict] = {}
    per_kernel: dict[tuple, list] = {}
    round_us, gaps = [], {"draft->verify": [], "verify->commit": [], "commit->draft": []}
    for rd, nxt in rounds:
        round_us.append((nxt["draft"][0]["start"] - rd["draft"][0]["start"]) / 1e3)
        gaps["draft->verify"].append((rd["verify"][0]["start"] - rd["draft"][-1]["end"]) / 1e3)
        gaps["verify->commit"].append((rd["commit"][0]["start"] - rd["verify"][-1]["end"]) / 1e3)
        gaps["commit->draft"].append((nxt["draft"][0]["start"] - rd["commit"][-1]["end"]) / 1e3)
        for p in ("draft", "verify", "commit"):
            ks = rd[p]
            s = stats.setdefault(p, {"gpu": [], "span": [], "n": []})
            s["gpu"].append(sum(k["end"] - k["start"] for k in ks) / 1e3)
            s["span"].append((ks[-1]["end"] - ks[0]["start"]) / 1e3)
            s["n"].append(len(ks))
            for k in ks:
                per_kernel.setdefault((p, k["name"]), []).append(k["end"] - k["start"])
    n = len(rounds)
    med = statistics.median
    lines = [f"CUPTI, budget 8, forced AL {FORCED_AL}, {key} ({n} rounds, medians; SYNTHETIC 27B Q4_K_M): round "
             f"{med(round_us) / 1e3:.3f} ms on the GPU clock; host-timed draft {host['draft']:.3f} / tree "
             f"{host['tree']:.3f} / verify {host['verify']:.3f} / commit {host['commit']:.3f} ms",
             "| phase | kernels | GPU busy ms | span ms | idle in span ms |", "|---|---|---|---|---|"]
    for p in ("draft", "verify", "commit"):
        s = stats[p]
        lines.append(f"| {p} | {med(s['n']):.0f} | {med(s['gpu']) / 1e3:.3f} | {med(s['span']) / 1e3:.3f} | "
                     f"{(med(s['span']) - med(s['gpu'])) / 1e3:.3f} |")
    lines.append("| gaps between phases (host: top-K copy + tree, argmax copy + walk, waits) | | | " +
                 " / ".join(f"{g} {med(v) / 1e3:.3f}" for g, v in gaps.items()) + " | |")
    lines += ["", "| phase | kernel | a round | ms a round | us each |", "|---|---|---|---|---|"]
    table = []
    for (p, name), durs in per_kernel.items():
        table.append((p, name, len(durs) / n, sum(durs) / n / 1e6, med(durs) / 1e3))
    for p in ("draft", "verify", "commit"):
        top = sorted((t for t in table if t[0] == p), key=lambda t: -t[3])[:14 if p != "commit" else 10]
        for t in top:
            lines.append(f"| {t[0]} | {t[1]} | {t[2]:.1f} | {t[3]:.3f} | {t[4]:.1f} |")
    R[f"timeline_{key}"] = {"rounds": n, "round_us": med(round_us), "host_ms": host,
                            "phases": {p: {"kernels": med(s["n"]), "gpu_us": med(s["gpu"]), "span_us": med(s["span"])}
                                       for p, s in stats.items()},
                            "gaps_us": {g: med(v) for g, v in gaps.items()},
                            "kernels": [list(t) for t in sorted(table, key=lambda t: -t[3])]}
    (OUT / f"timeline_{key}.md").write_text("\n".join(lines) + "\n")
    log("\n".join(lines))
    save()


def main() -> int:
    log(f"card: {cq.record_card()}")
    R["card"] = cq.R.get("card") or "?"
    src = ROOT / ".carry" / "dstep" / "before" / "engines"
    mark = src.parent / "COMMIT"
    if not (src / "CMakeLists.txt").is_file():
        log(f"FAILED: no before tree at {src} (carry .carry/dstep)")
        return 1
    R["before_commit"] = mark.read_text().strip() if mark.is_file() else "?"
    log(f"before: {src} (commit {R['before_commit']})")
    nproc = os.cpu_count() or 16
    paths: dict = {}
    threads = [guarded(build, ROOT / "engines", AFTER,
                       ["lucebench-ar", "lucebench-dflash", "lucebench-verify-gpu-check", "lucebench-verify-kernels-check",
                        "lucebench-dflash-gpu-check", "lucebench-gemm-bench"], max(2, nproc * 5 // 8), "after"),
               guarded(build, src, BEFORE, ["lucebench-dflash"], max(2, nproc * 3 // 8), "before"),
               guarded(synth_27b, paths), guarded(synth_08b), guarded(cq.build_timeline_lib)]
    for th in threads:
        th.join()
    log(f"builds done (after {R.get('build_after_s')} s, before {R.get('build_before_s')} s), synthetic models "
        f"done; CUPTI library: {cq.R.get('timeline_lib')}")
    save()
    if errors:
        log("FAILED: " + "; ".join(errors))
        return 1
    check_binary("lucebench-verify-kernels-check", [], lambda ln: "commit of 5 layers" in ln)
    check_binary("lucebench-verify-gpu-check", [], lambda ln: False, tail=12)
    gguf = Path("/tmp/dstep-ref-draft-q8_0.gguf")
    try:
        from lucebench.models.dflash_gguf import convert_draft
        convert_draft(ROOT / "tests/fixtures/reference-models/draft", gguf, wtype="q8_0")
        extra = [str(gguf)]
    except Exception as exc:  # noqa: BLE001
        log(f"GGUF draft conversion failed ({exc!r}): the GPU draft check without it")
        extra = []
    check_binary("lucebench-dflash-gpu-check", [str(ROOT / "tests/fixtures/reference-models/draft"), str(DRAFT_08B), *extra],
                 lambda ln: "top" in ln.lower())
    for fn, *a in ((gemm_draft,), (lossless_08b,), (speed, paths), (timeline, paths, AFTER, "after")):
        try:
            fn(*a)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{fn.__name__}: {exc!r}")
            log(f"FAILED {fn.__name__}: {exc!r}")
        save()
    # as time allows (each ~30-40 s): the before build's CUPTI round (the per-kernel before / after), then the
    # verify's cost per row count with its DeltaNet layer alone
    for fn, *a in ((timeline, paths, BEFORE, "before"), (verify_time, paths)):
        if time.time() - T0 > DEADLINE_S - 45:
            log(f"skipped {fn.__name__} {a[-1] if len(a) > 1 else ''}: {time.time() - T0:.0f} s gone")
            continue
        try:
            fn(*a)
        except Exception as exc:  # noqa: BLE001
            log(f"{fn.__name__} failed: {exc!r}")
    R["errors"] = errors
    R["wall_s"] = round(time.time() - T0, 1)
    save()
    sp = R.get("speed", {})

    def row(k):
        r = sp.get(k)
        return (f"{r['tok_s']:.1f} tok/s, round {r['round_ms']:.2f} ms (draft {r['per_round_ms']['draft']:.3f}, verify "
                f"{r['per_round_ms']['verify']:.3f}, commit {r['per_round_ms']['commit']:.3f})") if r else "n/a"
    log(f"SUMMARY ({R.get('card', '?').split(',')[0]}, SYNTHETIC 27B Q4_K_M, forced AL 8.31): ar "
        f"{R.get('ar_27b', {}).get('tok_s', 0):.1f} tok/s; budget 8 before {row('8_before')}; after {row('8_after')}; "
        f"budget 22 before {row('22_before')}; after {row('22_after')}; checks rc: verify-kernels "
        f"{R.get('lucebench-verify-kernels-check', {}).get('rc')}, verify-gpu {R.get('lucebench-verify-gpu-check', {}).get('rc')}, "
        f"dflash-gpu {R.get('lucebench-dflash-gpu-check', {}).get('rc')}; errors {errors}; {time.time() - T0:.0f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
