"""lucebench-dflash on a GPU (or the CPU build, for the CPU side of a comparison): losslessness against
lucebench-ar, real acceptance on the trained reference pair, and speed with forced acceptance.

Parts (--part, repeatable):
  lossless-synth  SYNTHETIC: a full-shape synthetic Qwen3.5-0.8B target + a random draft (`models synth
                  --draft-for`); dflash chain / tree at budgets 8, 22, 40, KV bf16 and q8_0, each prompt's
                  output against ar's greedy tokens (first divergence and ar's top-2 logit margin there).
  reference       TRAINED REFERENCE: the pair in tests/fixtures/reference-models, the prompts of
                  scripts/device/dflash_reference_prompts.json (HumanEval, GSM8K, MATH-500, 4 each), chain and
                  tree at budget 22 (KV bf16): lossless against ar, AL per dataset; with --cpu-baseline FILE,
                  the CPU engine's AL on the same prompts next to it.
  speed           SYNTHETIC, FORCED ACCEPTANCE: ar decode tok/s against dflash with --force-accept-length (8.31
                  = upstream's HumanEval AL) at each budget: decode tok/s, draft / tree / verify / commit ms per
                  round. Target: $DFLASH_TARGET (default the synthetic 0.8B), draft: $DFLASH_DRAFT (default a
                  random draft for the target), budgets: $DFLASH_BUDGETS (default 8,15,22,32,40; 15 runs as the
                  chain).
Everything goes to --out as JSON, plus summary.md; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from engine_client import Engine  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "reference-models"
SYNTH_TARGET = Path("/tmp/qwen35-0.8b-synth")
FORCED_AL = 8.31
MODES = {"chain": ["--chain"], "tree8": ["--budget", "8"], "tree22": ["--budget", "22"], "tree40": ["--budget", "40"]}

failures: list[str] = []
summary: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    summary.append(line)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


# A flip of AR's greedy choice below this relative margin ((top1 - top2) / max |logit|) is a near-tie: the
# verify's GEMMs round activations to bf16 where AR's decode GEMVs do not (verify_gpu_check.cu's bound).
NEAR_TIE = 2e-2


def rel_margin(logits: list[float]) -> float:
    a, b = sorted(logits, reverse=True)[:2]
    return (a - b) / max(max(abs(x) for x in logits), 1e-30)


def synth_draft(target: Path, out: Path) -> Path:
    if not (out / "config.json").is_file():
        from lucebench.models.dflash_draft import synthesize_draft

        synthesize_draft(target, out, seed=1)
    return out


def lossless(label: str, exe: dict[str, Path], target: Path, draft: Path, prompts: list[list[int]], n_gen: int,
             modes: list[str], kvs: list[str], backend: list[str], max_ctx: int) -> list[dict]:
    """Each mode's output against ar's, per prompt; the rounds' counts for the AL."""
    rows = []
    for kv in kvs:
        kvf = ["--kv-k", kv, "--kv-v", kv, "--max-ctx", str(max_ctx), *backend]
        ar = Engine(exe["ar"], target, *kvf)
        want = [ar.gen(p, n_gen)["output_ids"] for p in prompts]
        for mode in modes:
            t0 = time.time()
            e = Engine(exe["dflash"], target, "--draft", str(draft), *kvf, *MODES[mode])
            for i, p in enumerate(prompts):
                r = e.gen(p, n_gen)
                got = r["output_ids"]
                d = first_divergence(got, want[i])
                row = {"label": label, "kv": kv, "mode": mode, "prompt": i, "n_prompt": len(p), "n_gen": len(got),
                       "lossless": d is None, "first_divergence": d, "rounds": r["spec"]["draft_steps"],
                       "committed": r["spec"]["accepted_tokens"], "al": r["spec"]["acceptance_length"],
                       "time_ms": r["spec"]["time_ms"], "decode_ms": r["timing"]["decode_ms"], "output_ids": got}
                if d is not None and d < len(want[i]):
                    # how close ar's own choice was there: a near-tie flips under batched rounding
                    lr = ar.gen(p + want[i][:d], 1, return_logits=True)
                    row["ar_rel_margin"] = rel_margin(lr["last_logits"])
                    row["near_tie"] = row["ar_rel_margin"] < NEAR_TIE
                    row["ar_token"], row["dflash_token"] = want[i][d], got[d]
                rows.append(row)
            e.close()
            mine = [r for r in rows if r["kv"] == kv and r["mode"] == mode]
            diverged = [r for r in mine if not r["lossless"]]
            bad = [r for r in diverged if not r.get("near_tie", False)]
            detail = "; ".join(f"prompt {r['prompt']}: token {r['first_divergence']} (ar relative margin "
                               f"{r.get('ar_rel_margin', float('nan')):.1e}{', near-tie' if r.get('near_tie') else ''})"
                               for r in diverged)
            al = sum(r["committed"] for r in mine) / max(1, sum(r["rounds"] for r in mine))
            say(f"  {label} kv {kv:5s} {mode:7s} identical {len(mine) - len(diverged)}/{len(mine)} AL {al:.3f} "
                f"({time.time() - t0:.1f} s){'  FIRST DIVERGENCE ' + detail if diverged else ''}")
            if bad:
                failures.append(f"{label} kv {kv} {mode}: {detail}")
        ar.close()
    return rows


def part_lossless_synth(exe, out: Path, backend: list[str]) -> None:
    say("## SYNTHETIC: lossless against ar (full-shape synthetic Qwen3.5-0.8B + random draft)")
    draft = synth_draft(SYNTH_TARGET, Path("/tmp/dflash-0.8b-synth-draft"))
    rng = random.Random(0)
    prompts = [[rng.randrange(248000) for _ in range(n)] for n in (5, 40, 300)]
    rows = lossless("SYNTHETIC", exe, SYNTH_TARGET, draft, prompts, 64, list(MODES), ["bf16", "q8_0"], backend, 512)
    (out / "lossless_synthetic.json").write_text(json.dumps(rows, indent=1))


def part_reference(exe, out: Path, backend: list[str], cpu_baseline: Path | None) -> None:
    say("## TRAINED REFERENCE: tests/fixtures/reference-models (target 8.6 M, draft 2.0 M), n_gen 128, KV bf16")
    prompts = json.loads((REPO / "scripts/device/dflash_reference_prompts.json").read_text())["datasets"]
    base = json.loads(cpu_baseline.read_text()) if cpu_baseline else None
    result = {"datasets": {}}
    for name, ps in prompts.items():
        rows = lossless("TRAINED REFERENCE " + name, exe, FIXTURES / "target", FIXTURES / "draft", ps, 128,
                        ["chain", "tree22"], ["bf16"], backend, 512)
        al = {m: sum(r["committed"] for r in rows if r["mode"] == m) / max(1, sum(r["rounds"] for r in rows
                                                                               if r["mode"] == m))
              for m in ("chain", "tree22")}
        result["datasets"][name] = {"al": al, "rows": rows}
        line = f"  {name:9s} AL chain {al['chain']:.3f}  tree22 {al['tree22']:.3f}"
        if base:
            b = base["datasets"][name]
            line += f"   | CPU engine: chain {b['al']['chain']:.3f}  tree22 {b['al']['tree22']:.3f}"
            cpu_out = {(r["mode"], r["prompt"]): r["output_ids"] for r in b["rows"]}
            for m in ("chain", "tree22"):
                same = sum(1 for r in rows if r["mode"] == m and r["output_ids"] == cpu_out.get((m, r["prompt"])))
                line += f"; {m} outputs equal to the CPU engine's {same}/{len(ps)}"
        say(line)
    (out / "reference.json").write_text(json.dumps(result, indent=1))


def timed(e: Engine, prompt: list[int], n_gen: int, reps: int) -> list[dict]:
    e.gen(prompt, n_gen)  # warm-up: first-use allocations, graph capture
    return [e.gen(prompt, n_gen) for _ in range(reps)]


def part_speed(exe, out: Path, backend: list[str]) -> None:
    target = Path(os.environ.get("DFLASH_TARGET", str(SYNTH_TARGET)))
    draft = Path(os.environ["DFLASH_DRAFT"]) if os.environ.get("DFLASH_DRAFT") else synth_draft(
        target, Path("/tmp/dflash-speed-draft"))
    budgets = [int(b) for b in os.environ.get("DFLASH_BUDGETS", "8,15,22,32,40").split(",")]
    n_gen, reps = int(os.environ.get("DFLASH_N_GEN", "256")), 2
    say(f"## SYNTHETIC, FORCED ACCEPTANCE: speed on {target.name} (draft {draft.name}), prompt 64, n_gen {n_gen}")
    flags = ["--max-ctx", "1024", *backend]
    ar = Engine(exe["ar"], target, *flags)
    vocab = int(ar.ready["model"]["vocab_size"])
    rng = random.Random(1)
    prompt = [rng.randrange(vocab // 8, vocab // 2) for _ in range(64)]
    rs = timed(ar, prompt, n_gen, reps)
    ar.close()
    ar_tps = [(len(r["output_ids"]) - 1) / r["timing"]["decode_ms"] * 1e3 for r in rs]
    ar_ms = 1e3 / max(ar_tps)
    say(f"  ar: {max(ar_tps):.1f} tok/s decode ({ar_ms:.3f} ms a step; runs {', '.join(f'{t:.1f}' for t in ar_tps)})")
    rows = [{"engine": "ar", "tok_s": ar_tps, "step_ms": ar_ms}]
    say("  | budget | mode | forced AL | AL | tok/s | x ar | draft ms | tree ms | verify ms | verify / ar step | commit ms |")
    say("  |---|---|---|---|---|---|---|---|---|---|---|")
    for b in budgets:
        chain = b == 15
        forced = min(FORCED_AL, b + 1)
        e = Engine(exe["dflash"], target, "--draft", str(draft), *flags,
                   *(["--chain"] if chain else ["--budget", str(b)]), "--force-accept-length", str(forced))
        if e.ready["engine"]["options"].get("force_accept_length") != forced:
            failures.append(f"budget {b}: the ready line does not record force_accept_length {forced}")
        rs = timed(e, prompt, n_gen, reps)
        e.close()
        best = max(rs, key=lambda r: (len(r["output_ids"]) - 1) / r["timing"]["decode_ms"])
        sp = best["spec"]
        if sp.get("forced_acceptance_length") != forced:
            failures.append(f"budget {b}: the reply's spec does not mark the forced acceptance")
        steps = sp["draft_steps"]
        per = {k: v / steps for k, v in sp["time_ms"].items()}
        tps = (len(best["output_ids"]) - 1) / best["timing"]["decode_ms"] * 1e3
        say(f"  | {b} | {'chain' if chain else 'tree'} | {forced:.2f} | {sp['acceptance_length']:.2f} | {tps:.1f} | "
            f"{tps / max(ar_tps):.2f} | {per['draft']:.3f} | {per['tree']:.3f} | {per['verify']:.3f} | "
            f"{per['verify'] / ar_ms:.2f} | {per['commit']:.3f} |")
        rows.append({"engine": "dflash", "budget": b, "chain": chain, "forced_acceptance_length": forced,
                     "label": "SYNTHETIC, FORCED ACCEPTANCE", "al": sp["acceptance_length"], "tok_s": tps,
                     "per_round_ms": per, "runs": [r["spec"] | {"decode_ms": r["timing"]["decode_ms"]} for r in rs]})
    (out / "speed_forced.json").write_text(json.dumps({"target": str(target), "draft": str(draft), "n_gen": n_gen,
                                                       "rows": rows}, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="folder with lucebench-ar and lucebench-dflash")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--part", action="append", choices=["lossless-synth", "reference", "speed"])
    ap.add_argument("--backend", default=None, help="pass --backend to the engines (cpu for the CPU build)")
    ap.add_argument("--cpu-baseline", type=Path, default=None, help="reference.json of the CPU engine")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    exe = {"ar": a.build / "lucebench-ar", "dflash": a.build / "lucebench-dflash"}
    backend = ["--backend", a.backend] if a.backend else []
    for part in a.part or ["lossless-synth", "reference", "speed"]:
        t0 = time.time()
        try:  # a part that fails (an engine error, a crash) is reported and the next part still runs
            {"lossless-synth": lambda: part_lossless_synth(exe, a.out, backend),
             "reference": lambda: part_reference(exe, a.out, backend, a.cpu_baseline),
             "speed": lambda: part_speed(exe, a.out, backend)}[part]()
        except Exception as exc:  # noqa: BLE001
            say(f"  {part}: FAILED with {type(exc).__name__}: {exc}")
            failures.append(f"{part}: {type(exc).__name__}: {exc}")
        say(f"  ({part}: {time.time() - t0:.0f} s)")
    say("FAILED: " + " | ".join(failures) if failures else "all dflash checks passed")
    (a.out / "summary.md").write_text("\n".join(summary) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
