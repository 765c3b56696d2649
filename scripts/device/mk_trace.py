"""The megakernel's LB_MK_TRACE stamps (engines/megakernel/decode_kernel.cu, trace()) as a per-interval summary.

The engine writes one line per traced block ("block B: t0 t1 ..."): 16 clock64 slots a layer (cycles from the
block's first stamp; a slot the path does not write is negative), then the LM head's start and end. Needs no
torch (only lucebench's model shapes), so tests import it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from lucebench.models.shapes import default_layer_types

# LB_MK_TRACE stamp pairs (decode_kernel.cu, trace()) -> interval names, for the default fused path (the mixer
# stamps 6-8 before its end, 4; a block that runs an attention chunk also 14 and 15 inside it) and the unfused
# stages (3-14 in numeric order). A layer's valid stamps are taken
# in time order; a pair not named shows as "a->b".
TRACE_FUSED = {
    (0, 1): "in prologue", (1, 2): "in gemv+epilogue", (2, 3): "barrier in->mixer", (3, 6): "mixer: wait for in rows",
    (3, 4): "mixer", (4, 5): "barrier mixer->mlp",
    (5, 13): "writeback, clears, conv prefetch", (13, 9): "mlp prologue", (9, 12): "gate/up",
    (12, 10): "down + atomics", (10, 11): "barrier after mlp", (11, None): "to next layer",
}
TRACE_MIXER = {  # the fused mixers' own stamps
    "attention": {(6, 7): "attention: chunk (q/k/v, K/V rows, record)", (7, 8): "attention: wait for chunks",
                  (6, 14): "attention: chunk q/k norm + rope", (14, 15): "attention: chunk K/V rows (warp 0)",
                  (15, 7): "attention: chunk warp merge + record",
                  (8, 4): "attention: merge + o_proj rows + atomics", (7, 4): "attention: merge + o_proj rows + atomics"},
    "deltanet": {(6, 7): "deltanet: inputs round trip", (7, 8): "deltanet: step + gated norm",
                 (8, 4): "deltanet: out rows + atomics"},
}
TRACE_UNFUSED = {
    (0, 1): "in prologue", (1, 2): "in gemv+epilogue", (2, 3): "barrier in->mixer", (3, 4): "mixer",
    (4, 5): "barrier mixer->out", (5, 6): "out prologue", (6, 7): "out gemv", (7, 8): "barrier out->mlp",
    (8, 9): "mlp prologue", (9, 10): "mlp gemv", (10, 11): "barrier after mlp", (11, 12): "down prologue",
    (12, 13): "down gemv", (13, 14): "barrier after down", (14, None): "to next layer",
}


def trace_summary(path: Path, ghz: float, types: list[str] | None = None) -> dict:
    """Per-layer averages (us) of the v1 kernel's LB_MK_TRACE stamps (16 slots a layer, then the LM head's start
    and end), for block 0 and the middle block of the last traced token, grouped by layer type when given."""
    res: dict = {}
    for line in path.read_text().splitlines():
        label, _, nums = line.partition(":")
        t = [int(x) for x in nums.split()]
        n_layers = (len(t) - 2) // 16
        kinds = types if types and len(types) == n_layers else ["layer"] * n_layers
        groups: dict = {}
        for i in range(n_layers):
            lo, hi = t[i * 16], t[(i + 1) * 16]  # this layer's start, the next one's (or the LM head's)
            valid = {k: t[i * 16 + k] for k in range(16) if lo <= t[i * 16 + k] <= hi}
            fused = 6 in valid and 4 in valid and valid[6] < valid[4]
            group = {"full_attention": "attention", "linear_attention": "deltanet"}.get(kinds[i], kinds[i])
            names = {**TRACE_FUSED, **TRACE_MIXER.get(group, {})} if fused else TRACE_UNFUSED
            stamps = sorted((v, k) for k, v in valid.items()) + [(hi, None)]
            per = groups.setdefault(group, {})
            for (ta, a), (tb, b) in zip(stamps, stamps[1:]):
                per.setdefault(names.get((a, b), f"{a}->{'next layer' if b is None else b}"), []).append(tb - ta)
            per.setdefault("layer", []).append(hi - lo)
        out: dict = {g: {k: round(statistics.mean(v) / ghz / 1e3, 2) for k, v in per.items()} for g, per in groups.items()}
        out["lm head"] = round((t[n_layers * 16 + 1] - t[n_layers * 16]) / ghz / 1e3, 2)
        res[label.strip()] = out
    return res


def layer_types(ckpt: Path) -> list[str]:
    """The checkpoint's layer types (Qwen3.5: every 4th layer full attention unless the config lists them)."""
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    return cfg.get("layer_types") or default_layer_types(int(cfg["num_hidden_layers"]),
                                                         int(cfg.get("full_attention_interval", 4)))
