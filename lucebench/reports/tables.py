"""The report's tables, in the upstream layout, built from whatever cells exist.

Each builder returns a `Table` or None when the cells it needs are absent, so a CPU smoke result gets a
throughput table and nothing else, and a full RTX 3090 matrix gets all of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lucebench.matrix.pairing import pairing_key
from lucebench.reports import cells as C
from lucebench.reports.cells import KV_KEY, CellView
from lucebench.reports.fmt import NA, NOISY_MARK, fmt_summary, fmt_value
from lucebench.results.schema import Result

HEADERS = {"engine": "Method", "model": "Model", "card": "Card", "power_limit_w": "Power limit", "suite": "Suite",
           "kv_k": "KV K", "kv_v": "KV V", KV_KEY: "KV cache", "budget": "Budget", "keep_ratio": "Keep",
           "context": "Context", "gpu": "GPU"}


@dataclass
class Table:
    """A rendered table: string cells, rendered identically to Markdown and HTML."""

    key: str
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def _header(key: str) -> str:
    return HEADERS.get(key, key)


def _label_keys(views: Sequence[CellView], exclude: Sequence[str], always: Sequence[str] = ("engine",)) -> list[str]:
    keys = [k for k in always if k not in exclude]
    keys += [k for k in C.varying_keys(views, exclude=[*exclude, *always])]
    # K and V types read as one setting ("q8_0/q4_0"), not two columns that are "-" for engines without one
    if "kv_k" in keys or "kv_v" in keys:
        at = min(keys.index(k) for k in ("kv_k", "kv_v") if k in keys)
        keys = [k for k in keys if k not in ("kv_k", "kv_v")]
        keys.insert(at, KV_KEY)
    return keys


def _ok(views: Sequence[CellView]) -> list[CellView]:
    return [v for v in views if v.ok]


def _metric_cell(v: CellView | None, metric: str) -> str:
    return fmt_summary(v.cell.metrics.get(metric) if v is not None else None, metric)


FORCED_NOTE = ("AL marked 'forced': benchmark-only forced acceptance (dflash --force-accept-length): the rounds "
               "committed that many tokens on a fixed schedule, so the row is speed at that AL, not a measured "
               "acceptance, and its output is not the model's")


def _al_cell(v: CellView) -> str:
    """The AL, marked when it was forced rather than measured."""
    return _metric_cell(v, "acceptance_length") + (" forced" if C.is_forced(v) else "")


# ---------------------------------------------------------------------------------------------- throughput
def _throughput_views(views: Sequence[CellView]) -> list[CellView]:
    return [v for v in _ok(views) if not C.is_speculative(v) and not C.is_context(v) and not C.is_dataset(v)]


def throughput_table(views: Sequence[CellView]) -> Table | None:
    """Method | Prefill ppN | Decode tgN | tok/J (+ avg power, % roofline where measured)."""
    tv = _throughput_views(views)
    if not tv:
        return None
    suites = sorted({v.suite for v in tv})
    pre = [s for s in suites if s.startswith("pp") or (not s.startswith("tg") and
                                                      any(v.suite == s and v.median("prefill_tok_s") for v in tv))]
    dec = [s for s in suites if s.startswith("tg") or (not s.startswith("pp") and
                                                      any(v.suite == s and v.median("decode_tok_s") for v in tv))]
    label_keys = _label_keys(tv, exclude=["suite", "gpu"])
    groups: dict[tuple[Any, ...], list[CellView]] = {}
    for v in tv:
        groups.setdefault(C.key_of(v, label_keys), []).append(v)
    has_roof = any(v.median("roofline_pct") is not None for v in tv)
    headers = [_header(k) for k in label_keys]
    headers += [f"Prefill {s} (tok/s)" for s in pre]
    headers += [f"Decode {s} (tok/s)" for s in dec]
    headers += [f"tok/J {s}" if len(dec) > 1 else "tok/J" for s in dec]
    headers += ["avg power (W)"] + (["% roofline"] if has_roof else [])
    baselines = sorted({str(v.result.config.content.get("baseline")) for v in tv
                        if isinstance(v.result.config.content, dict) and v.result.config.content.get("baseline")})
    against = f" vs {' / '.join(baselines)}" if baselines else " vs baseline"
    speed_suites = [s for s in dec if any(v.suite == s and v.median("speedup_decode") is not None for v in tv)]
    match_suites = [s for s in suites if any(v.suite == s and v.median("token_match_pct") is not None for v in tv)]
    headers += [f"Decode speedup{against}" + (f" {s}" if len(speed_suites) > 1 else "") for s in speed_suites]
    headers += [f"Token agreement{against}" + (f" {s}" if len(match_suites) > 1 else "") for s in match_suites]
    rows = []
    for key, members in groups.items():
        by_suite = {v.suite: v for v in members}
        row = [C.fmt_param(k, val) for k, val in zip(label_keys, key)]
        row += [_metric_cell(by_suite.get(s), "prefill_tok_s") for s in pre]
        row += [_metric_cell(by_suite.get(s), "decode_tok_s") for s in dec]
        row += [_metric_cell(by_suite.get(s), "decode_tok_per_j") for s in dec]
        dec_cell = next((by_suite[s] for s in dec if s in by_suite), members[0])
        row.append(_metric_cell(dec_cell, "avg_power_w"))
        if has_roof:
            row.append(_metric_cell(dec_cell, "roofline_pct"))
        row += [_metric_cell(by_suite.get(s), "speedup_decode") for s in speed_suites]
        row += [_metric_cell(by_suite.get(s), "token_match_pct") for s in match_suites]
        rows.append(row)
    notes = [("median ± stddev (n = measured repetitions); tok/J from the energy counter over the "
              "decode window (n/a where power is unavailable)")]
    if speed_suites or match_suites:
        notes.append(f"speedup: decode tok/s over the baseline engine's ({', '.join(baselines) or 'baseline'}) on the "
                     "same workload; token agreement: share of prompts whose generated ids equal the baseline's")
    return Table("throughput", "Throughput and energy", headers, rows, notes=notes)


def power_sweep_table(views: Sequence[CellView]) -> Table | None:
    """Per engine, decode tok/s and tok/J at each power limit; the best tok/J marked (DVFS sweep)."""
    tv = [v for v in _throughput_views(views) if v.median("decode_tok_s") is not None and C.power_limit_of(v)]
    label_keys = _label_keys(tv, exclude=["power_limit_w", "suite", "gpu"])
    groups: dict[tuple[Any, ...], list[CellView]] = {}
    for v in tv:
        groups.setdefault(C.key_of(v, [*label_keys, "suite"]), []).append(v)
    rows = []
    for key, members in groups.items():
        if len({C.power_limit_of(v) for v in members}) < 2:
            continue
        best = max(members, key=lambda v: v.median("decode_tok_per_j") or float("-inf"))
        for v in sorted(members, key=lambda v: -(C.power_limit_of(v) or 0)):
            mark = "★ best tok/J" if v is best and v.median("decode_tok_per_j") is not None else ""
            rows.append([C.fmt_param(k, val) for k, val in zip(label_keys, key)] + [
                v.suite, C.fmt_param("power_limit_w", C.power_limit_of(v)), _metric_cell(v, "decode_tok_s"),
                _metric_cell(v, "decode_tok_per_j"), _metric_cell(v, "avg_power_w"), mark])
    if not rows:
        return None
    headers = [_header(k) for k in label_keys] + ["Suite", "Power limit", "Decode (tok/s)", "tok/J",
                                                  "avg power (W)", ""]
    return Table("power_sweep", "Power-limit sweep", headers, rows)


# ---------------------------------------------------------------------------------------------- speculative
def _baseline_engine(v: CellView) -> str | None:
    content = v.result.config.content
    return content.get("baseline") if isinstance(content, dict) else None


def ar_partners(v: CellView, views: Sequence[CellView]) -> dict[str, CellView]:
    """Every autoregressive cell a speculative cell is measured against (our `ar` and llama.cpp on the same GGUF,
    say), by engine: the same workload (`pairing_key`), the same KV type preferred; the run's baseline first."""
    key = pairing_key(v.params)
    cands = [o for o in _ok(views)
             if not C.is_speculative(o) and not C.is_compressed(o) and pairing_key(o.params) == key]
    cands.sort(key=lambda o: C.kv_label(o) != C.kv_label(v))
    found: dict[str, CellView] = {}
    for o in cands:
        found.setdefault(o.engine, o)
    base = _baseline_engine(v)
    return dict(sorted(found.items(), key=lambda kv: kv[0] != base))


def ar_partner(v: CellView, views: Sequence[CellView]) -> CellView | None:
    """The autoregressive cell that a speculative cell's speedup is against: the run's baseline engine's if it
    has one, else the first."""
    return next(iter(ar_partners(v, views).values()), None)


UPSTREAM_BUDGET = 22  # the DDTree budget of upstream's published DFlash table


def headline_budget(spec: Sequence[CellView]) -> Any:
    """The budget most suites share (the upstream table's 22); None when no cell has a budget."""
    per_suite: dict[str, set[Any]] = {}
    for v in spec:
        if "budget" in v.cell.params:
            per_suite.setdefault(v.suite, set()).add(v.cell.params["budget"])
    counts = Counter(b for budgets in per_suite.values() for b in budgets)
    if not counts:
        return None
    top = max(counts.values())
    tied = [b for b, n in counts.items() if n == top]
    # A sweep puts every budget in every suite: then the table shows upstream's headline budget if swept.
    return UPSTREAM_BUDGET if UPSTREAM_BUDGET in tied else min(tied)


def _ratio_text(v: CellView, partner: CellView | None) -> str:
    a, b = v.median("decode_tok_s"), partner.median("decode_tok_s") if partner else None
    return f"{a / b:.2f}x (ratio of medians)" if a is not None and b else NA


def _speedup_text(v: CellView, partner: CellView | None) -> str:
    s = v.cell.metrics.get("speedup_decode")
    if s is not None and s.median is not None:
        return fmt_summary(s, "speedup_decode")
    return _ratio_text(v, partner)


def _speedup_vs(v: CellView, partner: CellView | None, engine: str, several: bool) -> str:
    """The speedup in the column of AR engine `engine`: the cell's speedup metric only where that engine is the
    run's baseline (the metric is against it) or the only AR engine shown, else the ratio of medians."""
    return _speedup_text(v, partner) if engine == _baseline_engine(v) or not several else _ratio_text(v, partner)


def _ar_engine_order(spec: Sequence[CellView], partners: Sequence[dict[str, CellView]]) -> list[str]:
    """The AR engines of the speculative cells' partners, the runs' baseline engines first, then as met."""
    names = list(dict.fromkeys(e for ps in partners for e in ps))
    bases = {_baseline_engine(v) for v in spec}
    return sorted(names, key=lambda e: e not in bases)


def speculative_table(views: Sequence[CellView]) -> Table | None:
    """Benchmark | AR | speculative | AL | Speedup, at the headline DDTree budget."""
    spec = [v for v in _ok(views) if C.is_speculative(v)]
    if not spec:
        return None
    hb = headline_budget(spec)
    if hb is not None:
        spec = [v for v in spec if v.cell.params.get("budget", hb) == hb]
    label_keys = ["suite"] + [k for k in C.varying_keys(spec, exclude=["suite", "budget", "gpu"]) if k != "suite"]
    if len({v.engine for v in spec}) > 1:  # e.g. tree and chain: varying_keys leaves the engine to the caller
        label_keys.insert(1, "engine")
    partners = {id(v): ar_partners(v, views) for v in spec}
    ar_names = _ar_engine_order(spec, list(partners.values()))  # the baseline first
    spec_names = sorted({v.engine for v in spec})
    one = len(ar_names) <= 1  # one AR engine: the plain layout; several (ar, llama.cpp): a column pair each
    headers = ["Benchmark" if k == "suite" else _header(k) for k in label_keys]
    headers += ([f"AR {'/'.join(ar_names)} (tok/s)" if ar_names else "AR (tok/s)"] if one
                else [f"AR {e} (tok/s)" for e in ar_names])
    headers += [f"{'/'.join(spec_names)} (tok/s)", "AL"]
    headers += ["Speedup"] if one else [f"Speedup vs {e}" for e in ar_names]
    with_energy = any(v.median("decode_tok_per_j") is not None for v in spec)
    if with_energy:
        headers += (["AR tok/J"] if one else [f"{e} tok/J" for e in ar_names])
        headers += [f"{'/'.join(spec_names)} tok/J"]
    rows = []
    for v in sorted(spec, key=lambda v: C.key_of(v, label_keys).__repr__()):
        ps = [partners[id(v)].get(e) for e in ar_names] or [None]
        row = [C.fmt_param(k, val) for k, val in zip(label_keys, C.key_of(v, label_keys))]
        row += [_metric_cell(p, "decode_tok_s") for p in ps]
        row += [_metric_cell(v, "decode_tok_s"), _al_cell(v)]
        # the run's speedup metric is against its baseline (the first); the others are ratios of medians
        row += [_speedup_vs(v, p, e, not one) for p, e in zip(ps, ar_names)] if ar_names else [_speedup_text(v, None)]
        if with_energy:
            row += [_metric_cell(p, "decode_tok_per_j") for p in ps] + [_metric_cell(v, "decode_tok_per_j")]
        rows.append(row)
    notes = [f"DDTree budget {hb}" if hb is not None else "",
             "speedup = speculative decode tok/s over AR decode tok/s on the same prompts"
             + ("" if one else f"; against {ar_names[0]} the run's speedup metric, against the others the "
                                "ratio of medians" if ar_names[0] in {_baseline_engine(v) for v in spec}
                else "; ratios of medians"),
             "AL = tokens committed per draft+verify round, bonus token included (docs/metrics.md)",
             "tok/J = decode tokens per joule of the decode phase, gross" if with_energy else "",
             FORCED_NOTE if any(C.is_forced(v) for v in spec) else ""]
    return Table("speculative", "Speculative decoding", headers, rows, notes=[n for n in notes if n])


def dataset_table(views: Sequence[CellView]) -> Table | None:
    """Dataset suites run without speculative decoding: Benchmark | Method | TTFT | decode (| speedup)."""
    shown = {id(p) for s in _ok(views) if C.is_speculative(s) for p in ar_partners(s, views).values()}
    dv = [v for v in _ok(views) if C.is_dataset(v) and not C.is_speculative(v) and not C.is_context(v)
          and id(v) not in shown]  # AR cells paired with a speculative cell are already in that table
    if not dv:
        return None
    label_keys = ["suite", *_label_keys(dv, exclude=["suite", "gpu"])]
    has_speedup = any(v.median("speedup_decode") is not None for v in dv)
    headers = ["Benchmark" if k == "suite" else _header(k) for k in label_keys]
    headers += ["TTFT (ms)", "Decode (tok/s)"] + (["Speedup"] if has_speedup else [])
    rows = []
    for v in sorted(dv, key=lambda v: repr(C.key_of(v, label_keys))):
        row = [C.fmt_param(k, val) for k, val in zip(label_keys, C.key_of(v, label_keys))]
        row += [_metric_cell(v, "ttft_ms"), _metric_cell(v, "decode_tok_s")]
        if has_speedup:
            row.append(_metric_cell(v, "speedup_decode"))
        rows.append(row)
    return Table("datasets", "Dataset workloads", headers, rows,
                 notes=["one value per pass over the prompts (docs/metrics.md): the spread is run-to-run noise"])


def budget_sweep_table(views: Sequence[CellView]) -> Table | None:
    """Budget | AL | decode tok/s | speedup, for every group that sweeps the DDTree budget."""
    spec = [v for v in _ok(views) if C.is_speculative(v) and "budget" in v.cell.params]
    label_keys = _label_keys(spec, exclude=["budget", "gpu"], always=("engine", "suite"))
    groups: dict[tuple[Any, ...], list[CellView]] = {}
    for v in spec:
        groups.setdefault(C.key_of(v, label_keys), []).append(v)
    swept = {key: members for key, members in groups.items()
             if len({v.cell.params["budget"] for v in members}) >= 2}
    # the baseline's speedup column, then one for each other AR engine on the same prompts (llama.cpp, say)
    swept_cells = [v for members in swept.values() for v in members]
    partners = {id(v): ar_partners(v, views) for v in swept_cells}
    ar_names = _ar_engine_order(swept_cells, list(partners.values()))
    several = len(ar_names) > 1
    rows = []
    for key, members in swept.items():
        best = max(members, key=lambda v: v.median("decode_tok_s") or float("-inf"))
        for v in sorted(members, key=lambda v: float(v.cell.params["budget"])):
            ps = partners[id(v)]
            speedups = ([_speedup_vs(v, ps.get(e), e, several) for e in ar_names] if ar_names
                        else [_speedup_text(v, None)])
            rows.append([C.fmt_param(k, val) for k, val in zip(label_keys, key)] + [
                str(v.cell.params["budget"]), _al_cell(v), _metric_cell(v, "decode_tok_s"),
                *speedups, "★ fastest" if v is best else ""])
    if not rows:
        return None
    speedups = ["Speedup"] if len(ar_names) <= 1 else [f"Speedup vs {e}" for e in ar_names]
    headers = [_header(k) for k in label_keys] + ["Budget", "AL", "Decode (tok/s)", *speedups, ""]
    forced = any(C.is_forced(v) for v in spec)
    return Table("budget_sweep", "DDTree budget sweep", headers, rows, notes=[FORCED_NOTE] if forced else [])


ACCEPTANCE_DEPTHS = (1, 2, 3, 4, 6, 8, 11, 15)


def acceptance_table(views: Sequence[CellView]) -> Table | None:
    """Acceptance per draft depth and the AL histogram's shape, for speculative cells with per-depth counts."""
    from lucebench.metrics import acceptance_per_depth, al_histogram

    # forced-acceptance cells have no acceptance to show: their per-depth counts follow the forced schedule
    spec = [v for v in _ok(views) if C.is_speculative(v) and not C.is_forced(v) and acceptance_per_depth(v.cell.samples)]
    if not spec:
        return None
    label_keys = _label_keys(spec, exclude=["gpu"], always=("engine", "suite"))
    headers = [_header(k) for k in label_keys] + ["AL", "rounds"] + [f"d{d}" for d in ACCEPTANCE_DEPTHS]
    headers += ["rounds committing 1 / ≥ 8 / full block"]
    rows = []
    for v in sorted(spec, key=lambda v: repr(C.key_of(v, label_keys))):
        per_depth = acceptance_per_depth(v.cell.samples) or []
        hist = al_histogram(v.cell.samples) or []
        rounds = sum(hist) or None
        row = [C.fmt_param(k, val) for k, val in zip(label_keys, C.key_of(v, label_keys))]
        row += [_metric_cell(v, "acceptance_length"), str(rounds) if rounds else NA]
        row += [f"{per_depth[d - 1]:.2f}" if d <= len(per_depth) else NA for d in ACCEPTANCE_DEPTHS]
        if rounds:
            full = hist[-1] if len(hist) >= 17 else 0
            row.append(f"{hist[1] / rounds:.0%} / {sum(hist[8:]) / rounds:.0%} / {full / rounds:.0%}")
        else:
            row.append(NA)
        rows.append(row)
    return Table("acceptance", "Acceptance per draft depth", headers, rows, notes=[
        "d<k>: share of rounds whose draft token at depth k was accepted (pooled over the cell's requests)",
        "a full block commits 16 tokens (15 drafted + the bonus)"])


# ---------------------------------------------------------------------------------------------- context
def context_table(views: Sequence[CellView]) -> Table | None:
    """Context | KV | TTFT | decode (+ TTFT speedup where measured)."""
    cv = [v for v in _ok(views) if C.is_context(v)]
    if not cv:
        return None
    label_keys = _label_keys(cv, exclude=["context", "kv_k", "kv_v", KV_KEY, "gpu"])
    has_speedup = any(v.median("speedup_ttft") is not None for v in cv)
    headers = ["Context", "KV"] + [_header(k) for k in label_keys] + ["TTFT (ms)", "Decode (tok/s)"]
    headers += ["TTFT speedup"] if has_speedup else []
    rows = []
    for v in sorted(cv, key=lambda v: (C.context_of(v) or 0, C.kv_label(v), repr(C.key_of(v, label_keys)))):
        ctx = C.context_of(v)
        row = [f"{ctx:,}" if ctx is not None else NA, C.kv_label(v)]
        row += [C.fmt_param(k, val) for k, val in zip(label_keys, C.key_of(v, label_keys))]
        row += [_metric_cell(v, "ttft_ms"), _metric_cell(v, "decode_tok_s")]
        if has_speedup:
            row.append(_metric_cell(v, "speedup_ttft"))
        rows.append(row)
    return Table("context", "Long context", headers, rows)


def _full_prefill_partner(v: CellView, views: Sequence[CellView]) -> CellView | None:
    """The one full prefill a compressed cell's answers are compared with: the run's baseline engine's cell if
    there is one, else the first (full_prefills)."""
    fulls = full_prefills(v, views)
    baseline = _baseline_engine(v)
    return fulls.get(baseline) if baseline in fulls else next(iter(fulls.values()), None)


def full_prefills(v: CellView, views: Sequence[CellView]) -> dict[str, CellView]:
    """Every uncompressed cell a compressed prefill is measured against, by engine (ours and llama.cpp's, say):
    the same workload (`pairing_key`: the params but the engine axes, KV types included)."""
    key = pairing_key(v.params)
    return {o.engine: o for o in _ok(views) if not C.is_speculative(o) and not C.is_compressed(o)
            and pairing_key(o.params) == key}


def _ttft_speedup(v: CellView, full: CellView | None) -> str:
    """Full-prefill TTFT over the compressed TTFT: the run's metric where `full` is its baseline's cell, else
    the ratio of medians."""
    if full is None:
        return NA
    m = v.cell.metrics.get("speedup_ttft")
    content = v.result.config.content
    baseline = content.get("baseline") if isinstance(content, dict) else None
    if m is not None and m.median is not None and full.engine == baseline:
        return fmt_summary(m, "speedup_ttft")
    a, b = v.median("ttft_ms"), full.median("ttft_ms")
    return f"{b / a:.2f}x (ratio of medians)" if a and b else NA


def compressed_prefill_table(views: Sequence[CellView]) -> Table | None:
    """Context | method | KV | keep | TTFT and its split | tokens kept | effective prefill | vs each full prefill."""
    cv = [v for v in _ok(views) if C.is_compressed(v)]
    if not cv:
        return None
    # the suite is a column only where it varies (several needle variants in one run)
    label_keys = _label_keys(cv, exclude=["context", "kv_k", "kv_v", KV_KEY, "keep_ratio", "gpu"])
    fulls = {id(v): full_prefills(v, views) for v in cv}
    engines = sorted({e for f in fulls.values() for e in f}) or [""]
    one = len(engines) == 1  # one full-prefill engine: plain headers, the engine named in the note

    def head(text: str, engine: str) -> str:
        return text if one else f"{text}, {engine}"
    headers = ["Context", *[_header(k) for k in label_keys], "KV", "Keep", "TTFT (ms)",
               "scoring / select / bridge / target (ms)", "Kept (target tok)", "Effective prefill (tok/s)"]
    for e in engines:
        headers += [head("Full prefill TTFT (ms)", e), head("TTFT speedup", e)]
    with_energy = any(v.median("prefill_j") is not None for v in cv)
    if with_energy:
        headers += ["Prefill energy (J)"] + [head("Full prefill energy (J)", e) for e in engines]
    rows = []
    for v in sorted(cv, key=lambda v: (C.context_of(v) or 0, repr(C.key_of(v, label_keys)), C.kv_label(v),
                                       float(v.cell.params.get("keep_ratio") or 0))):
        ctx = C.context_of(v)
        split = " / ".join(fmt_value(v.median(f"prefill_{s}_ms"), f"prefill_{s}_ms")
                           for s in ("score", "select", "bridge", "target_prefill"))
        row = [f"{ctx:,}" if ctx is not None else NA,
               *[C.fmt_param(k, val) for k, val in zip(label_keys, C.key_of(v, label_keys))],
               C.kv_label(v), C.fmt_param("keep_ratio", v.cell.params.get("keep_ratio")),
               _metric_cell(v, "ttft_ms"), split, _metric_cell(v, "kept_tokens_target"),
               _metric_cell(v, "effective_prefill_tok_s")]
        for e in engines:
            full = fulls[id(v)].get(e)
            row += [_metric_cell(full, "ttft_ms"), _ttft_speedup(v, full)]
        if with_energy:
            row += [_metric_cell(v, "prefill_j")] + [_metric_cell(fulls[id(v)].get(e), "prefill_j") for e in engines]
        rows.append(row)
    named = f" ({engines[0]})" if one and engines[0] else ""
    notes = ["TTFT includes the drafter's scoring, the selection, the tokenizer bridge and the target's prefill of "
             "the kept prompt; effective prefill = prompt tokens before compression / TTFT",
             f"full prefill{named}: the cell of the same model, suite, context and KV type without compression"]
    if with_energy:
        notes.append("prefill energy: gross joules of the prefill windows (compressed: scoring, selection, bridge "
                     "and the target's prefill) per pass over the cell's prompts, the same prompts as its full "
                     "prefill's")
    return Table("compressed_prefill", "Compressed prefill: time to first token by context", headers, rows,
                 notes=notes)


def retention_table(views: Sequence[CellView]) -> Table | None:
    """Needle retention per context and needle depth: whether the compressed prompt kept each needle."""
    cv = [v for v in _ok(views) if C.is_compressed(v) and v.median("needle_retention_pct") is not None]
    if not cv:
        return None
    depths = sorted({d for v in cv for s in v.cell.samples if s.prefill and s.prefill.needle_depths
                     for d in s.prefill.needle_depths})
    label_keys = _label_keys(cv, exclude=["context", "kv_k", "kv_v", KV_KEY, "keep_ratio", "gpu"])
    headers = ["Context", *[_header(k) for k in label_keys], "KV", "Keep", "Retention"]
    partners = {id(v): _full_prefill_partner(v, views) for v in cv}
    # answers scored (--score): the compressed cell's beside its full prefill's, the same prompts
    scored = any(v.median("accuracy") is not None or (p := partners[id(v)]) is not None and p.median("accuracy")
                 is not None for v in cv)
    headers += [f"depth {d:g}" for d in depths] + (["Accuracy, compressed", "Accuracy, full prompt"] if scored else [])
    rows = []
    for v in sorted(cv, key=lambda v: (C.context_of(v) or 0, repr(C.key_of(v, label_keys)), C.kv_label(v))):
        ctx = C.context_of(v)
        first_rep = [s for s in v.cell.samples if s.rep == min(x.rep for x in v.cell.samples)]
        kept_at: dict[float, list[bool]] = {}
        for s in first_rep:
            if s.prefill and s.prefill.needles_kept and s.prefill.needle_depths:
                for d, k in zip(s.prefill.needle_depths, s.prefill.needles_kept):
                    kept_at.setdefault(d, []).append(k)
        row = [f"{ctx:,}" if ctx is not None else NA,
               *[C.fmt_param(k, val) for k, val in zip(label_keys, C.key_of(v, label_keys))],
               C.kv_label(v), C.fmt_param("keep_ratio", v.cell.params.get("keep_ratio")),
               _metric_cell(v, "needle_retention_pct")]
        row += [f"{sum(kept_at[d])}/{len(kept_at[d])}" if d in kept_at else NA for d in depths]
        if scored:
            row += [_metric_cell(v, "accuracy"), _metric_cell(partners[id(v)], "accuracy")]
        rows.append(row)
    notes = ["a needle is retained when every one of its tokens lies in the prompt ranges the engine kept; checked "
             "from the engine's kept ranges, independent of the answer",
             "depth columns: needles kept / needles in the first repetition's prompts"]
    if scored:
        notes.append("accuracy: share of the prompts whose first output holds every answer (the suite's scoring), "
                     "compressed and from the full-prefill cell of the same model, suite and context")
    return Table("retention", "Needle retention in the compressed prompt", headers, rows, notes=notes)


# ---------------------------------------------------------------------------------------------- problems
def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


MAX_REASON = 600


def reason_text(message: str, limit: int = MAX_REASON) -> str:
    """A failure's message for a table cell: whole, on one line; a very long one ends at a sentence or word
    boundary with a pointer to the full text, never mid-word."""
    text = " ".join(line.strip() for line in message.strip().splitlines() if line.strip())
    if len(text) <= limit:
        return text
    cut = text[:limit]
    end = max(cut.rfind(". "), cut.rfind("; "))
    cut = cut[:end + 1] if end > limit // 2 else cut[:cut.rfind(" ")] if " " in cut else cut
    return f"{cut} … (the full message is in results.json)"


def failed_table(views: Sequence[CellView]) -> Table | None:
    """Failed and skipped cells with their reasons."""
    bad = [v for v in views if not v.ok]
    if not bad:
        return None
    rows = []
    for v in bad:
        err = v.cell.error
        msg = reason_text(err.message) if err else "(no reason recorded)"
        rows.append([v.cell.id, _params_text(v.cell.params), v.cell.status, err.kind if err else NA, msg])
    return Table("failed", "Failed and skipped cells", ["Cell", "Params", "Status", "Kind", "Reason"], rows)


def noisy_table(views: Sequence[CellView]) -> Table | None:
    """One row per cell with metrics flagged noisy (CoV above the limit): the metrics and their CoV listed."""
    rows = []
    for v in _ok(views):
        noisy = [(name, m) for name, m in v.cell.metrics.items() if m.noisy]
        if noisy:
            listed = ", ".join(f"{name} {fmt_value(m.cov * 100, digits=1) + '%' if m.cov is not None else NA}"
                               for name, m in noisy)
            rows.append([v.cell.id, listed, str(max(m.n for _, m in noisy))])
    if not rows:
        return None
    return Table("noisy", f"Noisy measurements ({NOISY_MARK})", ["Cell", "Noisy metrics (CoV)", "n"], rows,
                 notes=["treat these numbers with care: re-run with more repetitions or a quieter machine"])


def contaminated_table(views: Sequence[CellView]) -> Table | None:
    """CPU cells that shared the machine with other busy processes (lucebench.measure.cpu_load)."""
    rows = [[v.cell.id, f"{v.cell.cpu_load.other_cores:.2f} of {v.cell.cpu_load.cpu_count}",
             "; ".join(v.cell.cpu_load.other_processes[:3]) or NA]
            for v in _ok(views) if v.cell.cpu_load is not None and v.cell.cpu_load.contaminated]
    if not rows:
        return None
    return Table("contaminated", "Cells measured on a busy machine", ["Cell", "Cores used by other processes",
                                                                      "Busiest other processes"], rows,
                 notes=["other processes took CPU time while these cells measured, so their numbers are not the "
                        "machine's: run them again on a quiet machine"])


# ---------------------------------------------------------------------------------------------- environment
def environment_rows(result: Result, key: str | None = None) -> list[tuple[str, str]]:
    """The environment block of one result: hardware, software, lucebench commit, synthetic weights. key:
    one of result.other_environments (a resumed run's earlier machine) and only its cells, instead of the
    run's latest environment."""
    env = result.other_environments[key] if key is not None else result.environment
    cells = [c for c in result.cells if c.environment_id == key]
    rows: list[tuple[str, str]] = [("run", f"{result.run_id} ({result.created})")]
    if result.other_environments:
        rows.append(("cells measured here", ", ".join(c.id for c in cells) or "none"))
    for g in env.gpus or []:
        lim = f"{g.power_limit_w:g} W" if g.power_limit_w is not None else NA
        rng = (f" (card range {g.power_limit_min_w:g}..{g.power_limit_max_w:g} W)"
               if g.power_limit_min_w is not None and g.power_limit_max_w is not None else "")
        rows.append((f"GPU {g.index}", f"{g.name}" + (f", sm {g.compute_capability}" if g.compute_capability else "")))
        rows.append((f"GPU {g.index} power limit", lim + rng))
        if g.memory_bandwidth_bytes_s:  # the roofline's denominator, which differs card to card
            rows.append((f"GPU {g.index} memory bandwidth", f"{g.memory_bandwidth_bytes_s / 1e12:.3f} TB/s"
                         + (f" ({g.memory_bandwidth_source})" if g.memory_bandwidth_source else "")))
    if not env.gpus:
        rows.append(("GPU", "none (CPU run; power unavailable)"))
    rows.append(("driver", env.driver_version or NA))
    if env.cuda_version:
        rows.append(("CUDA", env.cuda_version))
    if env.rocm_version:
        rows.append(("ROCm", env.rocm_version))
    if not env.cuda_version and not env.rocm_version:
        rows.append(("CUDA", NA))
    limits = sorted({lim for c in cells if (lim := C.power_limit_of(CellView(0, result, c, ""))) is not None})
    if limits:
        rows.append(("cell power limits", ", ".join(f"{x:g} W" for x in limits)))
    # The baseline every `*_net` energy subtracts: one value a run since a resume reuses it (older runs: several).
    idles = sorted({c.power.idle_power_w for c in cells if c.power is not None and c.power.idle_power_w is not None})
    if idles:
        rows.append(("idle power (net energies subtract it)", ", ".join(f"{x:.1f} W" for x in idles)
                     + (" (differs between cells: compare their net figures with care)" if len(idles) > 1 else "")))
    rows.append(("CPU", f"{env.cpu or NA}" + (f" ({env.cpu_count} cores)" if env.cpu_count else "")))
    rows.append(("OS", env.os + (f", kernel {env.kernel}" if env.kernel else "")))
    commit = env.lucebench_commit or NA
    dirty = " (dirty tree)" if env.lucebench_dirty else ""
    rows.append(("lucebench", f"{env.lucebench_version}, commit {commit}{dirty}, metrics {result.metrics_version}"))
    models: dict[tuple[str, str], bool] = {}  # (role, name) -> synthetic; a speculative cell's second model too
    for c in cells:
        for role, m in (("model", c.model), ("draft model", c.draft_model)):
            if m is not None:
                models[role, m.name] = models.get((role, m.name), False) or m.synthetic
    for (role, name), synthetic in models.items():
        rows.append((role, name + (" — synthetic weights (random; speed only, not quality)" if synthetic else "")))
    # The engine build's source hash (bundled engines) names the sources that ran even where the lucebench
    # commit above cannot (a copied tree whose git metadata lags its files); several when a resumed run
    # measured cells with different builds.
    engines: dict[str, str] = {}
    sources: dict[str, list[str]] = {}
    for c in cells:
        if c.engine is not None:
            bits = [b for b in (c.engine.version, c.engine.backend) if b]
            engines[c.engine.name] = ", ".join(bits) or NA
            src = str(c.engine.build.get("source_hash") or "")[:16]
            seen = sources.setdefault(c.engine.name, [])
            if src and src not in seen:
                seen.append(src)
    for name, text in engines.items():
        hashes = sources.get(name)
        rows.append((f"engine {name}", text + (f", engine sources {' + '.join(hashes)}" if hashes else "")))
    rows.append(("config", f"{result.config.path or NA} (sha256 {result.config.sha256[:12]})"))
    return rows


def any_synthetic(result: Result) -> bool:
    """True when any cell of the result used synthetic (random) weights."""
    return any(m is not None and m.synthetic for c in result.cells for m in (c.model, c.draft_model))


def all_tables(views: Sequence[CellView]) -> list[Table]:
    """Every table that the cells support, in report order: the results, then the caveats."""
    return result_tables(views) + caveat_tables(views)


def result_tables(views: Sequence[CellView]) -> list[Table]:
    """The measured results, what a report leads with."""
    builders = (throughput_table, power_sweep_table, speculative_table, dataset_table, budget_sweep_table,
                acceptance_table, context_table, compressed_prefill_table, retention_table)
    return [t for b in builders if (t := b(views)) is not None]


def caveat_tables(views: Sequence[CellView]) -> list[Table]:
    """What to read the results with: noisy metrics, cells on a busy machine, failed and skipped cells."""
    return [t for b in (noisy_table, contaminated_table, failed_table) if (t := b(views)) is not None]
