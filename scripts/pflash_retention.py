"""PFlash needle retention with controls: is a needle kept because of the drafter's attention?

For each needle prompt (lucebench's needle suites, built with the target's tokenizer) the pflash engine runs
once, at the first keep ratio, with `return_importance`; its kept ranges give the needle's survival (the
check independent of the answer). The drafter's importance does not depend on the keep ratio, so the other
keep ratios apply the selection to the same importance here (the drafter's forward over a long prompt is
the slow part on a CPU). Two controls use the same chunking, forced chunks and budget, bridged to the
target's tokens the same way:
- `random`: the non-forced chunks ranked by random scores (seeded) instead of the drafter's importance;
- `anchors`: the forced chunks only (head, tail, question anchors), without the importance-chosen ones;
- `importance_only` / `random_only`: no anchors (head and tail still forced), the rest of the budget by the
  drafter's importance / by random scores: what the drafter's attention finds on its own.
The selection and bridge are re-applied here in Python and must reproduce the engine's own kept ranges from
its importance (`engine_reproduced`), so the controls differ from the engine only in the scores.
Per prompt the drafter chunks holding each needle and every chunk's mean smoothed importance are stored too,
so the needle chunk's importance rank can be read without any budget (`needle_chunks`, `chunk_means`).
Answers: the target's greedy output on the full prompt (keep 1) and on the engine's compressed one (first
keep ratio), scored as the suite scores them, for the suites in --answer-suites.

    PYTHONPATH=. python scripts/pflash_retention.py --exe PATH/lucebench-pflash \\
        --target tests/fixtures/reference-models/target --drafter tests/fixtures/reference-models/drafter \\
        --suites needle,needle-lucebox,needle-multi,needle-vt,needle-code --lengths 8192 --keeps 0.05,0.1 \\
        --out results/pflash-retention.json [--drafter-sparse-from N --drafter-sparse-budget B]

The drafter's attention is the engine's default (block-sparse from 32,768 drafter tokens, alpha 0.85, budget
0.1) unless --drafter-sparse-from / --drafter-sparse-alpha / --drafter-sparse-budget say otherwise (0: dense);
each row records the values the engine used (`drafter_sparse`, and the drafter's KV type `drafter_kv`: bf16,
the engine's default; from its ready line).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from pathlib import Path

from lucebench.engines.bridge import PFlashBridge
from lucebench.runner.process import EngineProcess
from lucebench.suites.loader import prepare_workload
from lucebench.suites.needle import needles_kept
from lucebench.suites.scoring import score

CHUNK, HEAD, TAIL, WINDOW, NGRAM, MAX_HITS, RADIUS = 32, 8, 24, 96, 4, 8, 2  # engines/pflash/compress.h


_FORCED: dict[tuple[int, int, bool], set[int]] = {}  # (length, hash of the ids, anchors)


def forced_chunks(tokens: list[int], anchors: bool = True) -> set[int]:
    """The engine's forced chunks (head, tail, anchors); memoised per prompt, as the controls ask ten times."""
    key = (len(tokens), hash(tuple(tokens)), anchors)
    if key not in _FORCED:
        if len(_FORCED) > 8:
            _FORCED.clear()
        _FORCED[key] = _forced_chunks(tokens, anchors)
    return set(_FORCED[key])


def _forced_chunks(tokens: list[int], anchors: bool) -> set[int]:
    n = len(tokens)
    n_chunks = -(-n // CHUNK)
    forced = set(range(min(HEAD, n_chunks))) | set(range(max(0, n_chunks - TAIL), n_chunks))
    if not anchors:
        return forced
    window = max(0, n - WINDOW)
    earlier: dict[tuple[int, ...], list[int]] = {}
    for i in range(0, min(window, n - NGRAM + 1)):
        earlier.setdefault(tuple(tokens[i:i + NGRAM]), []).append(i)
    for g in {tuple(tokens[i:i + NGRAM]) for i in range(window, n - NGRAM + 1)}:
        hits = earlier.get(g, [])
        if 1 <= len(hits) <= MAX_HITS:
            for at in hits:
                forced.update(d for d in range(at // CHUNK - RADIUS, at // CHUNK + RADIUS + 1) if 0 <= d < n_chunks)
    return forced


def select(chunk_scores: list[float] | None, tokens: list[int], keep: float, anchors: bool = True) -> list[int]:
    """The engine's rule: forced chunks, then the best by score until the budget; None scores: forced only."""
    n_chunks = -(-len(tokens) // CHUNK)
    budget = max(1, int(n_chunks * keep + 1e-9))
    forced = forced_chunks(tokens, anchors)
    kept = set(forced)
    if chunk_scores is not None:
        for c in sorted((c for c in range(n_chunks) if c not in forced), key=lambda c: -chunk_scores[c]):
            if len(kept) >= budget:
                break
            kept.add(c)
    return sorted(kept)


def chunk_means(smoothed: list[float], n: int) -> list[float]:
    return [sum(smoothed[a:min(n, a + CHUNK)]) / (min(n, a + CHUNK) - a) for a in range(0, n, CHUNK)]


def needle_chunks(reference: dict, d_off: list[list[int]], t_off: list[list[int]]) -> list[list[int]]:
    """Per needle, the drafter chunks whose tokens overlap the needle's text (through the target's offsets)."""
    out = []
    for n in reference["needles"]:
        a, b = n["token_span"]
        ca, cb = t_off[a][0], t_off[b - 1][1]
        out.append(sorted({i // CHUNK for i, (s, e) in enumerate(d_off) if s < cb and e > ca}))
    return out


def bridge(kept: list[int], d_off: list[list[int]], t_off: list[list[int]]) -> list[list[int]]:
    """Kept drafter chunks -> kept target ranges (half-open), as engines/pflash/compress.cpp bridges."""
    nd = len(d_off)
    text_end = max(max(v for p in d_off for v in p), max(v for p in t_off for v in p))
    start, prev = [], 0
    for a, _ in d_off:
        prev = max(prev, a)
        start.append(prev)
    start.append(text_end)
    start[0] = 0
    spans, k = [], 0
    while k < len(kept):
        e = k
        while e + 1 < len(kept) and kept[e + 1] == kept[e] + 1:
            e += 1
        a, b = kept[k] * CHUNK, min(nd, (kept[e] + 1) * CHUNK)
        if start[b] > start[a] or b == nd:
            spans.append((start[a], max(start[b], start[a])))
        k = e + 1
    ranges: list[list[int]] = []
    # spans are disjoint and ascending and the target's offsets ascend, so one sweep finds each token's spans
    # (at 128K a token-by-span scan took seconds per call, ten calls a prompt)
    monotone = all(t_off[i][0] <= t_off[i + 1][0] for i in range(len(t_off) - 1))
    j = 0
    for i, (s, e) in enumerate(t_off):
        if monotone:
            while j < len(spans) and spans[j][1] < s:
                j += 1
            cands = []
            for A, B in spans[j:]:
                if A > max(s, e):
                    break
                cands.append((A, B))
        else:
            cands = spans
        hit = any((s < B and e > A) if e > s else (A <= s <= B) for A, B in cands)
        if hit:
            if ranges and ranges[-1][1] == i:
                ranges[-1][1] = i + 1
            else:
                ranges.append([i, i + 1])
    return ranges


def pct(flags: list[bool]) -> str:
    return f"{100 * sum(flags) / len(flags):.0f}% ({sum(flags)}/{len(flags)})" if flags else "n/a"


SINGLE = ("needle", "needle-lucebox", "needle-code", "needle-code-copy")  # one needle a case: the issue's >= 95% bar is on these


def summarize(rows: list[dict]) -> str:
    """Markdown tables, per suite and length: retention by method (the engine and the controls), by length
    and depth, the needle chunks' importance rank, answers with and without compression, time per case."""
    keeps = list(rows[0]["keeps"])
    groups = list(dict.fromkeys((r["suite"], r["length"]) for r in rows))
    out = ["| suite | length | cases | keep | kept % (target tokens) | forced chunks % | engine (drafter) | random "
           "scores | forced only | importance, no anchors | random, no anchors |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for suite, length in groups:
        rs = [r for r in rows if (r["suite"], r["length"]) == (suite, length)]
        for k in keeps:
            v = [r["keeps"][k] for r in rs]
            kept = sum(x["kept_tokens_target"] for x in v) / sum(r["prompt_tokens"] for r in rs)
            forced = sum(x["forced_chunks"] for x in v) / sum(x["n_chunks"] for x in v)
            out.append(f"| {suite} | {length} | {len(rs)} | {k} | {100 * kept:.1f} | {100 * forced:.1f} | "
                       + " | ".join(pct([f for x in v for f in x[key]]) for key in (
                           "needles_kept", "random_needles_kept", "anchors_needles_kept",
                           "importance_only_needles_kept", "random_only_needles_kept")) + " |")
    # Per length and needle depth: the single-needle suites (the >= 95% bar), then every suite's needles.
    out += ["", "| length | depth | single-needle suites, keep " + " / ".join(keeps) + " | all suites, keep "
            + " / ".join(keeps) + " |", "|---|---|---|---|"]
    for length in dict.fromkeys(r["length"] for r in rows):
        by_depth: dict[float, list[tuple[bool, list[bool]]]] = {}
        for r in (r for r in rows if r["length"] == length):
            for i, d in enumerate(r["depths"]):
                by_depth.setdefault(round(d, 1), []).append(
                    (r["suite"] in SINGLE, [r["keeps"][k]["needles_kept"][i] for k in keeps]))
        for d in sorted(by_depth):
            single = [x for one, x in by_depth[d] if one]
            out.append(f"| {length} | {d:.1f} | " + " / ".join(pct([x[j] for x in single]) for j in range(len(keeps)))
                       + " | " + " / ".join(pct([x[j] for _, x in by_depth[d]]) for j in range(len(keeps))) + " |")
    # Importance rank of each needle's best chunk among the chunks not forced as head or tail (0: the top).
    out += ["", "| suite | length | needles | median rank percentile of the needle's best chunk | in the top 5% | "
            "in the top 10% |", "|---|---|---|---|---|---|"]
    for suite, length in groups:
        ranks = []
        for r in (r for r in rows if (r["suite"], r["length"]) == (suite, length)):
            n = len(r["chunk_means"])
            cands = [c for c in range(n) if HEAD <= c < n - TAIL]
            order = sorted(cands, key=lambda c: -r["chunk_means"][c])
            pos = {c: i for i, c in enumerate(order)}
            for chunks in r["needle_chunks"]:
                inside = [pos[c] for c in chunks if c in pos]
                if inside:
                    ranks.append(min(inside) / len(cands))
        ranks.sort()
        med = f"{100 * ranks[len(ranks) // 2]:.0f}%" if ranks else "n/a (no chunk beyond head and tail)"
        out.append(f"| {suite} | {length} | {len(ranks)} | {med} | {pct([x < 0.05 for x in ranks])} | "
                   f"{pct([x < 0.10 for x in ranks])} |")
    answered = [r for r in rows if r["full"] is not None]
    if answered:
        out += ["", "| suite | length | cases | answer correct, full prompt | answer correct, keep " + keeps[0] + " |",
                "|---|---|---|---|---|"]
        for suite, length in dict.fromkeys((r["suite"], r["length"]) for r in answered):
            rs = [r for r in answered if (r["suite"], r["length"]) == (suite, length)]
            out.append(f"| {suite} | {length} | {len(rs)} | {pct([r['full']['passed'] for r in rs])} | "
                       f"{pct([r['keeps'][keeps[0]]['passed'] for r in rs])} |")
        out += ["", "Outputs (full prompt | compressed), the first case per suite and length:"]
        out += [f"- {r['prompt']}: {r['full']['output']!r} | {r['keeps'][keeps[0]]['output']!r}"
                for r in {(r["suite"], r["length"]): r for r in reversed(answered)}.values()]
    timed = [r for r in rows if r["keeps"][keeps[0]].get("time_ms")]
    if timed:
        out += ["", "| length | cases | median s a case (all requests) | median drafter scoring ms | median target "
                "prefill ms (kept) |", "|---|---|---|---|---|"]
        for length in dict.fromkeys(r["length"] for r in timed):
            rs = [r for r in timed if r["length"] == length]

            def med(xs: list[float]) -> float:
                xs = sorted(xs)
                return xs[len(xs) // 2] if xs else float("nan")
            out.append(f"| {length} | {len(rs)} | {med([r.get('seconds', float('nan')) for r in rs]):.1f} | "
                       f"{med([r['keeps'][keeps[0]]['time_ms']['score'] for r in rs]):,.0f} | "
                       f"{med([r['keeps'][keeps[0]]['time_ms']['target_prefill'] for r in rs]):,.0f} |")
    repro = [r["keeps"][keeps[0]]["engine_reproduced"] for r in rows]
    out += ["", f"Python selection + bridge equal to the engine's kept ranges: {sum(repro)}/{len(repro)} prompts."]
    return "\n".join(out)


def load_rows(path: Path) -> list[dict]:
    """A result file's rows, plain or gzipped (.json.gz)."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return json.loads(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    if len(sys.argv) >= 3 and sys.argv[1] == "--summarize":  # result files (plain or .json.gz), one summary
        rows = [r for f in sys.argv[2:] if Path(f).is_file() for r in load_rows(Path(f))]
        if not rows:
            print(f"no rows in {' '.join(sys.argv[2:])}")
            return 1
        print(summarize(rows))
        return 0
    ap.add_argument("--exe", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--suites", default="needle,needle-lucebox,needle-multi,needle-vt,needle-code")
    ap.add_argument("--lengths", default="8192")
    ap.add_argument("--keeps", default="0.05,0.1")
    ap.add_argument("--answer-suites", default="needle", help="suites whose full-prompt answers are generated too")
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="cpu", help="the engine's backend: cpu, or cuda for a CUDA build")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--drafter-sparse-from", type=int, help="the engine's --drafter-sparse-from (0: dense "
                                                            "drafter attention; default: the engine's, 32768)")
    ap.add_argument("--drafter-sparse-alpha", type=float, help="the engine's --drafter-sparse-alpha (default 0.85)")
    ap.add_argument("--drafter-sparse-budget", type=float, help="the engine's --drafter-sparse-budget (default 0.1)")
    args = ap.parse_args()
    sparse_flags = [f"--drafter-sparse-{k}={v!r}" for k, v in (("from", args.drafter_sparse_from),
                    ("alpha", args.drafter_sparse_alpha), ("budget", args.drafter_sparse_budget)) if v is not None]
    keeps = [float(k) for k in args.keeps.split(",")]
    bridge_tok = PFlashBridge(args.target, args.drafter)
    rows: list[dict] = []
    for length in [int(x) for x in args.lengths.split(",")]:
        argv = [str(args.exe), "--model", str(args.target), "--drafter", str(args.drafter), "--backend", args.backend,
                "--max-ctx", str(length + args.n_gen + 64), "--min-prompt-tokens", "0", *sparse_flags]
        engines = {k: EngineProcess(argv + ["--keep-ratio", repr(k)], log_path=args.out.with_suffix(f".{k}.log"))
                   for k in [1.0, keeps[0]]}
        try:
            for e in engines.values():
                e.wait_ready(120)
            opts = engines[keeps[0]].ready["engine"]["options"]
            drafter_sparse = {k: opts.get(f"drafter_sparse_{k}") for k in ("from", "alpha", "budget")}
            drafter_kv = opts.get("drafter_kv", opts.get("kv_k"))  # an engine without --drafter-kv: kv_k's
            for suite in args.suites.split(","):
                w = prepare_workload(suite, tokenizer_dir=args.target, context=length, n_gen=args.n_gen)
                for p in w.prompts:
                    fields = bridge_tok.fields(p.token_ids)
                    req = {"type": "generate", "prompt_ids": p.token_ids, "n_gen": w.n_gen, "ignore_eos": w.ignore_eos,
                           "eos_ids": w.eos_ids, **fields}
                    t0 = time.monotonic()
                    full_text = None
                    if suite in args.answer_suites.split(","):
                        full = engines[1.0].request({**req, "id": p.id}, 600)
                        full_text = bridge_tok.target.decode(full["output_ids"])
                    row = {"suite": suite, "length": length, "prompt": p.id, "prompt_tokens": len(p.token_ids),
                           "drafter_tokens": len(fields["drafter_ids"]),
                           "depths": [n["depth"] for n in p.reference["needles"]],
                           "full": None if full_text is None else {
                               "output": full_text, "passed": bool(score(w, p, full_text).get("correct"))},
                           "keeps": {}}
                    r = engines[keeps[0]].request({**req, "id": p.id, "return_importance": True}, 600)
                    text = bridge_tok.target.decode(r["output_ids"])
                    pf = r["prefill"]
                    d_ids = fields["drafter_ids"]
                    means = chunk_means(r["importance_smoothed"], len(d_ids))
                    row["chunk_means"] = means
                    # a block-sparse drafter (--drafter-sparse-*): the share of its causal key tiles it read
                    row["drafter_sparse"] = drafter_sparse
                    row["drafter_kv"] = drafter_kv
                    row["drafter_attention_read"] = pf.get("drafter_attention_read")
                    row["needle_chunks"] = needle_chunks(p.reference, fields["drafter_offsets"], fields["target_offsets"])
                    for k in keeps:
                        rng = random.Random(f"{args.seed}/{p.id}/{k}")
                        kept_chunks = select(means, d_ids, k)
                        ours = bridge(kept_chunks, fields["drafter_offsets"], fields["target_offsets"])
                        ctl_random = bridge(select([rng.random() for _ in means], d_ids, k),
                                            fields["drafter_offsets"], fields["target_offsets"])
                        ctl_anchor = bridge(select(None, d_ids, k), fields["drafter_offsets"], fields["target_offsets"])
                        imp_only = bridge(select(means, d_ids, k, anchors=False), fields["drafter_offsets"],
                                          fields["target_offsets"])
                        rnd_only = bridge(select([rng.random() for _ in means], d_ids, k, anchors=False),
                                          fields["drafter_offsets"], fields["target_offsets"])
                        row["keeps"][str(k)] = {
                            "kept_tokens_target": sum(b - a for a, b in ours), "kept_chunks": len(kept_chunks),
                            "forced_chunks": pf["forced_chunks"], "n_chunks": pf["n_chunks"],
                            "engine_reproduced": ours == pf["kept_ranges"] if k == keeps[0] else None,
                            "needles_kept": needles_kept(p.reference, ours),
                            "random_needles_kept": needles_kept(p.reference, ctl_random),
                            "anchors_needles_kept": needles_kept(p.reference, ctl_anchor),
                            "anchors_kept_tokens": sum(b - a for a, b in ctl_anchor),
                            "importance_only_needles_kept": needles_kept(p.reference, imp_only),
                            "random_only_needles_kept": needles_kept(p.reference, rnd_only),
                            "importance_only_kept_tokens": sum(b - a for a, b in imp_only),
                            **({"output": text, "passed": bool(score(w, p, text).get("correct")),
                                "time_ms": pf["time_ms"]} if k == keeps[0] else {})}
                    row["seconds"] = round(time.monotonic() - t0, 2)
                    rows.append(row)
                    print(json.dumps({"prompt": p.id, "s": round(time.monotonic() - t0, 1), "full_passed": row["full"] and row["full"]["passed"],
                                      **{k: [v["needles_kept"], v["random_needles_kept"], v["anchors_needles_kept"],
                                             v["importance_only_needles_kept"], v["random_only_needles_kept"],
                                             v["engine_reproduced"]] for k, v in row["keeps"].items()}}), flush=True)
                    args.out.write_text(json.dumps(rows, indent=1))
        finally:
            for e in engines.values():
                e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
