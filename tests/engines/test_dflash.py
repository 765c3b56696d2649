"""The DFlash engine's CPU pieces: DDTree, the walk and the acceptance statistics (C++ unit checks), and the
CPU draft forward against a PyTorch reference of the same forward (z-lab's DFlashDraftModel semantics:
KV injection of the context features, unmasked full-attention layers, windowed-causal sliding layers,
rotate-half RoPE over the whole head at absolute positions, the target's embedding and LM head)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import dflash_synth
import numpy as np
import pytest
import torch
from safetensors.torch import save_file


@pytest.fixture(scope="module")
def dflash_tests_exe(ar_exe) -> Path:
    """lucebench-dflash-tests, built in the CPU engine build directory."""
    build = ar_exe.parent
    subprocess.run(["cmake", "--build", str(build), "--target", "lucebench-dflash-tests", "-j", "2"], check=True,
                   capture_output=True)
    return build / "lucebench-dflash-tests"


def test_dflash_unit_tests(dflash_tests_exe):
    """DDTree against brute-force enumeration, chain / chain seed / ties, scripted walks, statistics."""
    proc = subprocess.run([str(dflash_tests_exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "all passed" in proc.stderr


# ------------------------------------------------------------------------------------------- the draft

SHAPE = dflash_synth.ODD_SHAPE


@pytest.mark.parametrize("variant", ["full", "sliding"])
def test_draft_forward_matches_torch(tmp_path, dflash_tests_exe, variant):
    """Several rounds through the draft cache (prompt, then each round's accepted rows) against a from-scratch
    reference: hidden rows and logits per block position, relative error and argmax."""
    s = SHAPE
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"] if variant == "sliding" else None
    window = 4 if variant == "sliding" else None  # shorter than the context: the window matters
    w = dflash_synth.make_draft(tmp_path / "draft", seed=3, layer_types=layer_types, sliding_window=window,
                   placement="dflash_config" if variant == "full" else "top_level",
                   target_layer_ids=[1, 4, 7] if variant == "full" else None)  # None: z-lab's default ids
    g = torch.Generator().manual_seed(4)
    rows_per_round = [7, 3, 1, 5]  # the prompt, then accepted + 1 rows per round
    io = {"lm_head": torch.randn(s["vocab"], s["hidden"], generator=g)}
    for r, n in enumerate(rows_per_round):
        io[f"features.{r}"] = torch.randn(n, s["n_feat"] * s["hidden"], generator=g)
        io[f"embed.{r}"] = torch.randn(s["block"], s["hidden"], generator=g) * 0.5
    (tmp_path / "io").mkdir()
    save_file(io, str(tmp_path / "io" / "model.safetensors"))
    (tmp_path / "io" / "config.json").write_text(json.dumps({"rounds": len(rows_per_round)}))
    out = tmp_path / "out.bin"
    proc = subprocess.run([str(dflash_tests_exe), "draft-forward", str(tmp_path / "draft"), str(tmp_path / "io"), str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "3 features of 22, context 16" in proc.stderr
    got = np.fromfile(out, dtype=np.float32)
    n, H, V = s["block"] - 1, s["hidden"], s["vocab"]
    assert got.size == len(rows_per_round) * n * (H + V)
    got = torch.from_numpy(got.astype(np.float64)).view(len(rows_per_round), n * (H + V))
    feats = torch.zeros(0, s["n_feat"] * s["hidden"], dtype=torch.float64)
    for r in range(len(rows_per_round)):
        feats = torch.cat([feats, io[f"features.{r}"].double()])
        ref_h = dflash_synth.reference_block(w, feats, io[f"embed.{r}"].double(), layer_types=layer_types, window=window)
        ref_l = ref_h @ io["lm_head"].double().T
        h, logits = got[r, : n * H].view(n, H), got[r, n * H:].view(n, V)
        for pos in range(n):  # block position pos + 1
            rel_h = float((h[pos] - ref_h[pos]).norm() / ref_h[pos].norm())
            rel_l = float((logits[pos] - ref_l[pos]).norm() / ref_l[pos].norm())
            assert rel_h < 1e-5 and rel_l < 1e-5, (variant, r, pos + 1, rel_h, rel_l)
            top2 = ref_l[pos].topk(2).values
            if float(top2[0] - top2[1]) > 1e-4:  # argmax agreement away from near-ties
                assert int(logits[pos].argmax()) == int(ref_l[pos].argmax()), (variant, r, pos + 1)
    # The sliding window and causal block change the result: the mask is exercised, not vacuous.
    if variant == "sliding":
        full = dflash_synth.reference_block(w, feats, io[f"embed.{len(rows_per_round) - 1}"].double())
        assert float((full - ref_h).norm() / ref_h.norm()) > 1e-2


@pytest.mark.parametrize("case,message", [
    ("drop", "missing tensor 'layers.1.self_attn.k_norm.weight'"),
    ("shape", "tensor 'layers.2.mlp.up_proj.weight' has shape [29, 22], expected [30, 22]"),
    ("dflash2", "belongs to a DFlash2 draft"),
    ("no_mask", "missing 'mask_token_id'"),
])
def test_draft_load_errors(tmp_path, dflash_tests_exe, case, message):
    """A malformed draft is one clear message naming the tensor or key, never a crash."""
    kw = {"drop": {"drop": "layers.1.self_attn.k_norm.weight"}, "shape": {"bad_shape": "layers.2.mlp.up_proj.weight"},
          "dflash2": {"extra_tensors": {"candidate_selector.hidden_projection.weight": torch.zeros(2, 2)}},
          "no_mask": {}}[case]
    dflash_synth.make_draft(tmp_path / "draft", seed=1, **kw)
    if case == "no_mask":
        cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
        del cfg["dflash_config"]["mask_token_id"]
        (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    io = tmp_path / "io"
    io.mkdir()
    save_file({"lm_head": torch.zeros(2, 2)}, str(io / "model.safetensors"))
    (io / "config.json").write_text(json.dumps({"rounds": 0}))
    proc = subprocess.run([str(dflash_tests_exe), "draft-forward", str(tmp_path / "draft"), str(io), str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
