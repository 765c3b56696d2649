"""The report's PNG plots (matplotlib, Agg backend: no display needed).

Each function draws one figure from whatever cells exist and returns None when its cells are absent.
Error bars are the stddev of the repetitions; missing values are left out, never drawn as 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: reports are rendered on headless CI runners

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from lucebench.reports import cells as C
from lucebench.reports.cells import CellView
from lucebench.reports.tables import ar_partner, full_prefills

MAX_TIMELINES = 6


@dataclass(frozen=True)
class Plot:
    """One written PNG: its file name (relative to the report folder), a title and a caption."""

    file: str
    title: str
    caption: str


def weights_note(views: Sequence[CellView]) -> str:
    """Which weights produced a figure, for its footer: the models (and drafts) of its cells, the synthetic ones
    said to be so (random weights measure speed only)."""
    synthetic: dict[str, bool] = {}
    for v in views:
        for m in (v.cell.model, v.cell.draft_model):
            if m is not None:
                synthetic[m.name] = synthetic.get(m.name, False) or m.synthetic
    if not synthetic:
        return ""
    names = list(synthetic)
    shown = ", ".join(names[:3]) + (f" +{len(names) - 3} more" if len(names) > 3 else "")
    if all(synthetic.values()):
        return f"SYNTHETIC weights (random: speed only): {shown}"
    if any(synthetic.values()):
        return f"weights: {shown} (some SYNTHETIC: speed only)"
    return f"weights: {shown}"


def _save(fig: Figure, out_dir: Path, name: str, views: Sequence[CellView] = ()) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    note = weights_note(views)
    with warnings.catch_warnings():
        # a crowded figure keeps matplotlib's default margins; its warning would only clutter the run's output
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout(rect=(0, 0.04, 1, 1) if note else (0, 0, 1, 1))
    if note:
        fig.text(0.995, 0.005, note, ha="right", va="bottom", fontsize=7, color="#555555")
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name


def _err(v: CellView, metric: str) -> float:
    m = v.metric(metric)
    return m.stddev if m is not None and m.stddev is not None else 0.0


def _series_label(v: CellView, keys: Sequence[str]) -> str:
    """A bar or line label in words: the engine, then "KV <type>" and the other varying settings that apply to
    this cell (an axis that does not apply to it is left out, never shown as "-")."""
    parts: list[str] = []
    kv_said = False
    for k in keys:
        if k in ("kv_k", "kv_v", C.KV_KEY):
            if not kv_said and (v.params.get("kv_k") is not None or v.params.get("kv_v") is not None):
                parts.append(f"KV {C.kv_label(v)}")
                kv_said = True
            continue
        value = v.params.get(k)
        if value is None:
            continue
        parts.append(str(value) if k == "engine" else f"{k.replace('_', ' ')} {C.fmt_param(k, value)}")
    return ", ".join(parts) or v.engine


def _ok(views: Sequence[CellView]) -> list[CellView]:
    return [v for v in views if v.ok]


def _workload_of(views: Sequence[CellView], metric: str, family: str) -> str | None:
    """The one workload a throughput panel shows: the `family` (pp/tg) suite measured by the most engines,
    else any suite with the metric. A panel never mixes workloads: an engine whose cell of it failed has no bar."""
    def count(suites: Sequence[str]) -> str | None:
        tally: dict[str, int] = {}
        for s in suites:
            tally[s] = tally.get(s, 0) + 1
        return max(tally, key=lambda s: (tally[s], s)) if tally else None

    measured = [v for v in views if v.median(metric) is not None]
    return (count([v.suite for v in measured if v.suite.startswith(family) and v.suite[len(family):].isdigit()])
            or count([v.suite for v in measured]))


def throughput_panels(views: Sequence[CellView]) -> list[tuple[str, str, str | None, dict[str, CellView]]]:
    """(metric, title, workload, {bar label: cell}) of the prefill and decode panels: each panel is one workload,
    so an engine whose cell of it failed has no bar rather than another workload's."""
    tv = [v for v in _ok(views) if not C.is_speculative(v) and not C.is_context(v) and not C.is_dataset(v)]
    if not tv:
        tv = _ok(views)
    keys = ["engine", *C.varying_keys(tv, exclude=["engine", "engine_type", "suite", "power_limit_w", "gpu"])]
    panels = []
    for metric, title, family in (("prefill_tok_s", "Prefill", "pp"), ("decode_tok_s", "Decode", "tg")):
        workload = _workload_of(tv, metric, family)
        bars: dict[str, CellView] = {}
        for v in sorted(tv, key=lambda v: -(C.power_limit_of(v) or 0)):
            # At several power limits the highest one stands for the engine (its unconstrained speed).
            if v.suite == workload and v.median(metric) is not None:
                bars.setdefault(_series_label(v, keys), v)
        panels.append((metric, title, workload, bars))
    return panels


def throughput_bars(views: Sequence[CellView], out_dir: Path) -> Plot | None:
    """Prefill (a pp workload) and decode (a tg workload) tok/s per engine, bars with stddev; each panel is one
    workload, named in its title."""
    panels = throughput_panels(views)
    if not any(bars for *_, bars in panels):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    shown = []
    for ax, (metric, title, workload, bars) in zip(axes, panels):
        labels = list(bars)
        ax.bar(range(len(labels)), [bars[g].median(metric) for g in labels],
               yerr=[_err(bars[g], metric) for g in labels], capsize=4, color="#4c72b0")
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
        ax.set_ylabel("tok/s")
        ax.set_title(f"{title}, {workload}" if labels else f"{title} (not measured)")
        if labels:
            shown.append(f"{title.lower()}: {workload}")
    return Plot(_save(fig, out_dir, "throughput.png", views), "Throughput per engine",
                f"median tok/s with stddev error bars; one workload per panel ({'; '.join(shown)})")


def power_sweep(views: Sequence[CellView], out_dir: Path) -> Plot | None:
    """Decode tok/s and tok/J vs power limit per engine, the best tok/J point marked."""
    tv = [v for v in _ok(views) if not C.is_speculative(v) and not C.is_context(v) and not C.is_dataset(v)
          and v.median("decode_tok_s") is not None and C.power_limit_of(v) is not None]
    keys = ["engine", *C.varying_keys(tv, exclude=["engine", "power_limit_w", "gpu"])]
    series: dict[str, list[CellView]] = {}
    for v in tv:
        series.setdefault(_series_label(v, keys), []).append(v)
    series = {k: sorted(s, key=lambda v: C.power_limit_of(v) or 0) for k, s in series.items()
              if len({C.power_limit_of(v) for v in s}) >= 2}
    if not series:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, s in series.items():
        x = [C.power_limit_of(v) for v in s]
        ax1.errorbar(x, [v.median("decode_tok_s") for v in s], yerr=[_err(v, "decode_tok_s") for v in s],
                     marker="o", capsize=3, label=label)
        pts = [(C.power_limit_of(v), v.median("decode_tok_per_j"), _err(v, "decode_tok_per_j")) for v in s
               if v.median("decode_tok_per_j") is not None]
        if pts:
            ax2.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                         label=label)
            best = max(pts, key=lambda p: p[1])
            ax2.scatter([best[0]], [best[1]], s=220, marker="*", color="gold", edgecolor="black", zorder=5)
            ax2.annotate(f"best {best[1]:.2f} tok/J @ {best[0]:g} W", (best[0], best[1]),
                         textcoords="offset points", xytext=(6, 8), fontsize=8)
    ax1.set(xlabel="power limit (W)", ylabel="decode tok/s", title="Decode throughput vs power limit")
    ax2.set(xlabel="power limit (W)", ylabel="decode tok/J", title="Energy efficiency vs power limit")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    return Plot(_save(fig, out_dir, "power_sweep.png", views), "Throughput and tok/J vs power limit",
                "the star marks the most energy-efficient power limit")


def speedup_by_dataset(views: Sequence[CellView], out_dir: Path) -> Plot | None:
    """Speculative decode speedup over AR per dataset (at each budget present in several datasets)."""
    from lucebench.reports.tables import headline_budget

    spec = [v for v in _ok(views) if C.is_speculative(v)]
    hb = headline_budget(spec)
    spec = [v for v in spec if v.cell.params.get("budget", hb) == hb]
    bars: list[tuple[str, float, float]] = []
    for v in sorted(spec, key=lambda v: v.suite):
        s = v.metric("speedup_decode")
        if s is not None:
            bars.append((v.suite, s.median or 0.0, s.stddev or 0.0))
            continue
        p = ar_partner(v, views)
        a, b = v.median("decode_tok_s"), p.median("decode_tok_s") if p is not None else None
        if a is not None and b:
            bars.append((v.suite, a / b, 0.0))
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], yerr=[b[2] for b in bars], capsize=4, color="#55a868")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    for i, b in enumerate(bars):
        ax.text(i, b[1], f"{b[1]:.2f}x", ha="center", va="bottom")
    ax.set(ylabel="decode speedup over AR", title="Speculative decoding speedup by dataset"
           + (f" (budget {hb})" if hb is not None else ""))
    return Plot(_save(fig, out_dir, "speedup_by_dataset.png", views), "Speedup by dataset", "decode tok/s over AR tok/s")


def budget_sweep(views: Sequence[CellView], out_dir: Path) -> Plot | None:
    """Acceptance length and decode tok/s vs DDTree budget."""
    spec = [v for v in _ok(views) if "budget" in v.cell.params]
    keys = ["engine", "suite", *C.varying_keys(spec, exclude=["engine", "suite", "budget", "gpu"])]
    series: dict[str, list[CellView]] = {}
    for v in spec:
        series.setdefault(_series_label(v, keys), []).append(v)
    series = {k: sorted(s, key=lambda v: float(v.cell.params["budget"])) for k, s in series.items()
              if len({v.cell.params["budget"] for v in s}) >= 2}
    if not series:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    any_forced = False
    for label, s in series.items():
        x = [float(v.cell.params["budget"]) for v in s]
        forced = any(C.is_forced(v) for v in s)  # its AL is the benchmark's setting, not an acceptance
        any_forced |= forced
        for ax, metric in ((ax1, "acceptance_length"), (ax2, "decode_tok_s")):
            pts = [(xi, v.median(metric), _err(v, metric)) for xi, v in zip(x, s) if v.median(metric) is not None]
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                            capsize=3, label=label + (" (AL forced)" if forced else ""))
    ax1.set(xlabel="DDTree budget", ylabel="acceptance length (tok/step)", title="AL vs budget")
    ax2.set(xlabel="DDTree budget", ylabel="decode tok/s", title="Decode throughput vs budget")
    ax1.legend(fontsize=8)
    caption = "AL and tok/s per budget" + ("; 'AL forced': benchmark-only forced acceptance "
                                          "(dflash --force-accept-length), a setting, not a measured AL"
                                          if any_forced else "")
    return Plot(_save(fig, out_dir, "budget_sweep.png", views), "DDTree budget sweep", caption)


def context_sweep(views: Sequence[CellView], out_dir: Path) -> Plot | None:
    """Decode tok/s vs context length, one line per KV type (and engine)."""
    cv = [v for v in _ok(views) if C.is_context(v) and C.context_of(v) is not None]
    keys = ["engine", *C.varying_keys(cv, exclude=["engine", "context", "kv_k", "kv_v", "gpu"])]
    series: dict[str, list[CellView]] = {}
    for v in cv:
        series.setdefault(f"{_series_label(v, keys)} kv={C.kv_label(v)}", []).append(v)
    series = {k: s for k, s in series.items() if any(v.median("decode_tok_s") is not None for v in s)}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, s in series.items():
        pts = sorted((C.context_of(v), v.median("decode_tok_s"), _err(v, "decode_tok_s")) for v in s
                     if v.median("decode_tok_s") is not None)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    label=label)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="context length (tokens)", ylabel="decode tok/s", title="Decode throughput vs context")
    ax.legend(fontsize=8)
    return Plot(_save(fig, out_dir, "context_sweep.png", views), "Decode vs context length", "one line per KV type")


def ttft_vs_length(views: Sequence[CellView], out_dir: Path) -> Plot | None:
    """Time to first token vs prompt length: compressed prefill against full prefill, one line per method,
    KV type and keep ratio; the TTFT speedup over full prefill beside it where both exist."""
    cv = [v for v in _ok(views) if C.is_context(v) and C.context_of(v) is not None and v.median("ttft_ms")]
    if not any(C.is_compressed(v) for v in cv):
        return None
    keys = ["engine", *C.varying_keys(cv, exclude=["engine", "context", "gpu", "suite"])]
    series: dict[str, list[CellView]] = {}
    for v in cv:
        series.setdefault(_series_label(v, keys), []).append(v)
    suites = sorted({v.suite for v in cv})

    def med(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, s in sorted(series.items()):
        # several suites (needle variants) at one length: the same prompt length, so one point, their median
        by_ctx: dict[int, list[CellView]] = {}
        for v in s:
            by_ctx.setdefault(C.context_of(v) or 0, []).append(v)
        pts = sorted((ctx, med([(v.median("ttft_ms") or 0) / 1e3 for v in vs]),
                      _err(vs[0], "ttft_ms") / 1e3 if len(vs) == 1 else 0.0) for ctx, vs in by_ctx.items())
        style = "-" if C.is_compressed(s[0]) else "--"
        ax1.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                     linestyle=style, label=label)
        if C.is_compressed(s[0]):
            ratios: dict[str, dict[int, list[float]]] = {}  # full-prefill engine -> context -> ratios
            for v in s:
                for engine, full in full_prefills(v, views).items():
                    if full.median("ttft_ms") and v.median("ttft_ms"):
                        ratios.setdefault(engine, {}).setdefault(C.context_of(v) or 0, []).append(
                            full.median("ttft_ms") / v.median("ttft_ms"))
            for engine, per in sorted(ratios.items()):
                r = sorted((ctx, med(xs)) for ctx, xs in per.items())
                ax2.plot([x[0] for x in r], [x[1] for x in r], marker="o",
                         label=f"{label} vs {engine}")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set(xlabel="prompt length (tokens)", ylabel="time to first token (s)", title="TTFT vs prompt length")
    ax2.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax2.set(xlabel="prompt length (tokens)", ylabel="full-prefill TTFT / compressed TTFT",
            title="TTFT speedup of compressed prefill")
    ax1.legend(fontsize=7)
    if ax2.lines[1:]:
        ax2.legend(fontsize=7)
    over = f"; each point the median over the suites {', '.join(suites)}" if len(suites) > 1 else ""
    return Plot(_save(fig, out_dir, "ttft_vs_length.png", views), "Time to first token vs prompt length",
                "solid: compressed prefill (scoring, selection, bridge and the target's prefill of the kept prompt); "
                "dashed: full prefill; speed-up against each full prefill of the same KV type" + over)


def acceptance_by_depth(views: Sequence[CellView], out_dir: Path) -> Plot | None:
    """Acceptance per draft depth and the AL histogram of each speculative cell at the headline budget."""
    from lucebench.metrics import acceptance_per_depth, al_histogram
    from lucebench.reports.tables import headline_budget

    spec = [v for v in _ok(views) if C.is_speculative(v) and acceptance_per_depth(v.cell.samples)]
    if not spec:
        return None
    hb = headline_budget(spec)
    spec = [v for v in spec if v.cell.params.get("budget", hb) == hb]
    keys = ["engine", "suite", *C.varying_keys(spec, exclude=["engine", "suite", "budget", "gpu"])]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for v in sorted(spec, key=lambda v: _series_label(v, keys)):
        label = _series_label(v, keys)
        per_depth = acceptance_per_depth(v.cell.samples) or []
        ax1.plot(range(1, len(per_depth) + 1), per_depth, marker="o", label=label)
        hist = al_histogram(v.cell.samples) or []
        rounds = sum(hist)
        if rounds:
            ax2.plot(range(len(hist)), [n / rounds for n in hist], marker=".", label=label)
    ax1.set(xlabel="draft depth", ylabel="share of rounds accepting it", ylim=(0, 1.02),
            title="Acceptance per depth" + (f" (budget {hb})" if hb is not None else ""))
    ax2.set(xlabel="tokens committed in a round (bonus included)", ylabel="share of rounds", title="AL histogram")
    ax1.legend(fontsize=7)
    return Plot(_save(fig, out_dir, "acceptance.png", views), "Acceptance per draft depth and AL histogram",
                "pooled over each cell's requests (docs/metrics.md)")


def roofline(views: Sequence[CellView], out_dir: Path) -> Plot | None:
    """% of the memory-bandwidth roofline reached by decode, per engine (best cell of each)."""
    best: dict[str, CellView] = {}
    for v in _ok(views):
        r = v.median("roofline_pct")
        if r is None:
            continue
        label = f"{v.engine} ({v.card})" if len({x.card for x in views}) > 1 else v.engine
        if label not in best or r > (best[label].median("roofline_pct") or 0):
            best[label] = v
    if not best:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = list(best)
    ax.bar(labels, [best[k].median("roofline_pct") for k in labels],
           yerr=[_err(best[k], "roofline_pct") for k in labels], capsize=4, color="#c44e52")
    ax.axhline(100, color="black", linewidth=1)
    ax.axhspan(70, 80, color="green", alpha=0.1, label="good decode kernels (70-80%)")
    ax.set(ylabel="% of memory-bandwidth roofline", ylim=(0, 110), title="Decode vs bandwidth roofline")
    ax.legend(fontsize=8)
    return Plot(_save(fig, out_dir, "roofline.png", views), "% of memory-bandwidth roofline",
                "bytes moved per token x tok/s over peak bandwidth; best cell per engine")


def timeline_title(v: CellView) -> str:
    """A power-timeline title that fits its plot: engine, KV type and power limit in words, then the workload."""
    return f"{_series_label(v, ['engine', 'kv_k', 'power_limit_w'])}: {v.suite}"


def power_timelines(views: Sequence[CellView], out_dir: Path, limit: int = MAX_TIMELINES) -> list[Plot]:
    """Power over time of the cells with a power trace (decode cells first, at most `limit`)."""
    traced = [v for v in views if v.cell.power_trace]
    traced.sort(key=lambda v: (v.median("decode_tok_s") is None, v.cell.id))
    plots = []
    for v in traced[:limit]:
        t = [p[0] for p in v.cell.power_trace]
        w = [p[1] for p in v.cell.power_trace]
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot(t, w, linewidth=1)
        if v.cell.power is not None and v.cell.power.limit_w:
            ax.axhline(v.cell.power.limit_w, color="red", linestyle="--", linewidth=1, label="power limit")
            ax.legend(fontsize=8)
        title = timeline_title(v)
        ax.set(xlabel="seconds since cell start", ylabel="W")
        ax.set_title(title, fontsize=10)
        plots.append(Plot(_save(fig, out_dir, f"power_{C.slug(v.cell.id)}.png", [v]), f"Power timeline: {title}",
                          "decimated NVML power samples"))
    return plots


def all_plots(views: Sequence[CellView], out_dir: Path) -> list[Plot]:
    """Every plot the cells support, written under out_dir."""
    out: list[Plot] = []
    for fn in (throughput_bars, power_sweep, speedup_by_dataset, budget_sweep, acceptance_by_depth, context_sweep,
               ttft_vs_length, roofline):
        p = fn(views, out_dir)
        if p is not None:
            out.append(p)
    out.extend(power_timelines(views, out_dir))
    return out


def grouped_bars(rows: dict[str, dict[str, float]], errs: dict[str, dict[str, float]], ylabel: str, title: str,
                 out_dir: Path, name: str) -> str:
    """A grouped bar chart: one group per key of `rows` (e.g. engine), one bar per inner key (e.g. card)."""
    groups = list(rows)
    series: list[str] = sorted({s for r in rows.values() for s in r})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * max(1, len(series)) / 2 + 3), 4))
    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        xs = [g_i + i * width for g_i, g in enumerate(groups) if s in rows[g]]
        ys: list[Any] = [rows[g][s] for g in groups if s in rows[g]]
        es = [errs.get(g, {}).get(s, 0.0) for g in groups if s in rows[g]]
        ax.bar(xs, ys, width=width, yerr=es, capsize=3, label=s)
    ax.set_xticks([g_i + width * (len(series) - 1) / 2 for g_i in range(len(groups))], groups, rotation=15)
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    return _save(fig, out_dir, name)
