"""`lucebench-dflash --draft FILE.gguf`: a DFlash draft in Lucebox's GGUF layout (written by `lucebench models
convert-draft`) drafts exactly as the same draft in safetensors when its values are the same (F32, and BF16
from a BF16 draft), and as the F32 file of its decoded values when they are not (F16, Q8_0, Q4_K/Q6_K):
same tokens, same acceptance histogram, round for round. A GGUF that is no plain DFlash draft is refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import dflash_synth
import gguf
import numpy as np
import pytest
import qwen35_synth as synth
import torch
from conftest import Engine
from gguf_writer import write_qwen35_gguf

from lucebench.models.dflash_draft import read_draft_config
from lucebench.models.dflash_gguf import GGUF_ARCH, convert_draft, decoded_draft, gguf_metadata, write_draft_gguf

VOCAB = 48  # small, so that a random draft's proposals are often accepted (see test_dflash_engine.py)
SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=96, n_feat=2, vocab=VOCAB, block=16,
             target_layers=4)
# Rows of 256 values (hidden 256, MLP 256, 4 x 64 query heads, 2 features): k-quant blocks fit every matrix.
K_SHAPE = dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, inter=256, n_feat=2, vocab=VOCAB, block=8,
               target_layers=4)
PROMPTS = [[int(t) for t in torch.randint(0, VOCAB - 1, (n,), generator=torch.Generator().manual_seed(n))]
           for n in (5, 12, 30)]
N_GEN = 40
MODES = {"chain": ["--chain"], "tree22": ["--budget", "22"]}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gguf_draft")
    target = synth.save(synth.make_model(seed=6, vocab_size=VOCAB), root / "target")
    dflash_synth.make_draft(root / "draft", seed=7, shape=SHAPE, target_layer_ids=[1, 2], mask_token_id=VOCAB - 1)
    return target, root / "draft"


def run(exe: Path, target: Path, draft: Path, flags: list[str]) -> tuple[dict, list[tuple[list[int], dict]]]:
    """The ready line, and per prompt the output tokens with the reply's spec counts (times left out)."""
    e = Engine(exe, target, "--draft", str(draft), *flags)
    out = []
    for p in PROMPTS:
        r = e.generate(p, N_GEN)
        assert r["type"] == "result", r
        out.append((r["output_ids"], {k: v for k, v in r["spec"].items() if k != "time_ms"}))
    assert e.close() == 0
    return e.ready, out


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("wtype", ["f32", "bf16"])
def test_exact_gguf_drafts_as_safetensors(dflash_exe, pair, tmp_path, mode, wtype):
    """The same values in a GGUF: the same tokens and acceptance, round for round."""
    target, draft = pair
    ready_st, want = run(dflash_exe, target, draft, MODES[mode])
    path = convert_draft(draft, tmp_path / f"draft-{wtype}.gguf", wtype=wtype).path
    ready, got = run(dflash_exe, target, path, MODES[mode])
    assert got == want
    # The draft is exercised: some round accepted a draft token (else every draft would agree).
    assert sum(sum(spec["al_histogram"][2:]) for _, spec in want) > 0
    opts, opts_st = ready["engine"]["options"], ready_st["engine"]["options"]
    assert opts_st["draft_format"] == "safetensors" and opts_st["draft_file_types"] == {"bf16": 25}
    assert opts["draft_format"] == "gguf" and opts["draft_dtype"] == "f32"
    assert opts["draft_file_types"] == ({"f32": 25} if wtype == "f32" else {"f32": 10, "bf16": 15})


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_rounded_gguf_drafts_as_their_decoded_values(dflash_exe, pair, tmp_path, wtype):
    """F16 and Q8_0 change the values: the engine drafts as with an F32 GGUF of the values gguf-py decodes."""
    target, draft = pair
    path = convert_draft(draft, tmp_path / f"draft-{wtype}.gguf", wtype=wtype).path
    cfg = read_draft_config(draft)
    dec = decoded_draft(path, cfg)
    ref = tmp_path / "decoded.gguf"
    write_draft_gguf(ref, cfg, dec, name="decoded", file_type=0)
    src = dflash_synth.make_draft(tmp_path / "again", seed=7, shape=SHAPE, target_layer_ids=[1, 2],
                                  mask_token_id=VOCAB - 1)
    changed = sum(not np.array_equal(dec[n][0], src[n].float().numpy()) for n in dec)
    if wtype == "q8_0":
        assert changed == 15  # every matrix is rounded: the comparison is not between identical files
    ready, got = run(dflash_exe, target, path, MODES["tree22"])
    _, want = run(dflash_exe, target, ref, MODES["tree22"])
    assert got == want
    assert ready["engine"]["options"]["draft_file_types"] == {"f32": 10, wtype: 15}


def random_k_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """Random k-quant blocks [rows, row bytes] whose values have a standard deviation near 1/sqrt(cols)."""
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // elems, size), dtype=np.uint8)
    d_at = {gguf.GGMLQuantizationType.Q4_K: 0, gguf.GGMLQuantizationType.Q6_K: 208}[qtype]

    def set_d(d: float) -> None:
        raw[:, :, d_at:d_at + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        if qtype == gguf.GGMLQuantizationType.Q4_K:  # dmin: centre the values (mean q x scale = dmin x min)
            raw[:, :, 2:4] = np.frombuffer(np.float16(7.5 * d).tobytes(), np.uint8)

    set_d(1.0)
    s = float(gguf.quants.dequantize(raw.reshape(rows, -1), qtype).std())
    set_d(1.0 / (s * cols ** 0.5))
    return raw.reshape(rows, -1)


def test_k_quant_gguf_draft_as_its_decoded_values(dflash_exe, tmp_path):
    """A Q4_K_M-style draft (Q4_K matrices, Q6_K attn_v and ffn_down, F32 norms), as Lucebox's llama-quantize'd
    drafts are typed: the engine drafts as with the F32 file of its decoded values."""
    target = synth.save(synth.make_model(seed=3, vocab_size=VOCAB, hidden_size=256), tmp_path / "target")
    dflash_synth.make_draft(tmp_path / "st", seed=4, shape=K_SHAPE, target_layer_ids=[1, 2], mask_token_id=VOCAB - 1)
    cfg = read_draft_config(tmp_path / "st")
    rng = np.random.default_rng(5)
    T = gguf.GGMLQuantizationType
    quant, dec = {}, {}
    for name, shape in cfg.tensor_shapes().items():
        if len(shape) == 1:
            x = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
            quant[name] = dec[name] = (x, T.F32)
            continue
        qt = T.Q6_K if name.endswith(("v_proj.weight", "down_proj.weight")) else T.Q4_K
        raw = random_k_blocks(rng, shape[0], shape[1], qt)
        quant[name] = (raw, qt)
        dec[name] = (gguf.quants.dequantize(raw, qt).astype(np.float32).reshape(shape), T.F32)
    write_draft_gguf(tmp_path / "q4_k_m.gguf", cfg, quant, name="k", file_type=15)
    write_draft_gguf(tmp_path / "decoded.gguf", cfg, dec, name="decoded", file_type=0)
    for mode in ("chain", "tree22"):
        ready, got = run(dflash_exe, target, tmp_path / "q4_k_m.gguf", MODES[mode])
        _, want = run(dflash_exe, target, tmp_path / "decoded.gguf", MODES[mode])
        assert got == want, mode
    assert ready["engine"]["options"]["draft_file_types"] == {"f32": 10, "q4_k": 11, "q6_k": 4}


def test_sliding_window_draft(dflash_exe, pair, tmp_path):
    """A draft with a sliding-window layer (window 6, shorter than every prompt): the window and the per-layer
    pattern travel in the GGUF's attention.sliding_window(_pattern) keys."""
    target, _ = pair
    draft = tmp_path / "swa"
    dflash_synth.make_draft(draft, seed=9, shape=SHAPE, target_layer_ids=[1, 2], mask_token_id=VOCAB - 1,
                            layer_types=["sliding_attention", "full_attention"], sliding_window=6)
    path = convert_draft(draft, tmp_path / "swa.gguf", wtype="f32").path
    meta = gguf.GGUFReader(str(path)).fields
    assert meta[f"{GGUF_ARCH}.attention.sliding_window_pattern"].contents() == [True, False]
    _, want = run(dflash_exe, target, draft, MODES["tree22"])
    _, got = run(dflash_exe, target, path, MODES["tree22"])
    assert got == want
    # the window matters here: the same draft with full attention everywhere drafts otherwise
    keys = {k: v for k, v in gguf_metadata(read_draft_config(draft), 32768).items() if "sliding" not in k}
    write_draft_gguf(tmp_path / "full.gguf", read_draft_config(draft), decoded_draft(path, read_draft_config(draft)),
                     name="full", file_type=0, keys=keys)
    _, full = run(dflash_exe, target, tmp_path / "full.gguf", MODES["tree22"])
    assert [s for _, s in full] != [s for _, s in want]


def test_default_target_layer_ids_from_the_targets_depth(dflash_exe, pair, tmp_path):
    """Without dflash.target_layer_ids the reference rule round(1 + i (L - 4) / (n - 1)) with the target's L
    (4 layers here, n = 2 features: layers 1 and 1): as the safetensors draft that lists [1, 1]."""
    target, _ = pair
    draft = tmp_path / "d"
    dflash_synth.make_draft(draft, seed=8, shape=SHAPE, target_layer_ids=[1, 1], mask_token_id=VOCAB - 1)
    cfg = read_draft_config(draft)
    path = convert_draft(draft, tmp_path / "with-ids.gguf", wtype="f32").path
    keys = {k: v for k, v in gguf_metadata(cfg, 32768).items() if not k.endswith("target_layer_ids")}
    write_draft_gguf(tmp_path / "no-ids.gguf", cfg, decoded_draft(path, cfg), name="no ids", file_type=0, keys=keys)
    _, want = run(dflash_exe, target, draft, MODES["tree22"])
    _, got = run(dflash_exe, target, tmp_path / "no-ids.gguf", MODES["tree22"])
    assert got == want


def load_error(exe: Path, target: Path, draft: Path) -> dict:
    proc = subprocess.run([str(exe), "--model", str(target), "--draft", str(draft)], capture_output=True, text=True,
                          timeout=60)
    [line] = [json.loads(s) for s in proc.stdout.splitlines()]
    assert proc.returncode != 0 and line["type"] == "error", line
    return line


def test_gguf_that_is_no_draft_is_refused(dflash_exe, pair, tmp_path):
    target, draft = pair
    model = synth.make_model(seed=6, vocab_size=VOCAB)
    line = load_error(dflash_exe, target, write_qwen35_gguf(model, tmp_path / "target.gguf"))
    assert line["kind"] == "unsupported" and "not a DFlash draft" in line["message"], line
    assert "target model" in line["message"]

    cfg = read_draft_config(draft)
    path = convert_draft(draft, tmp_path / "ok.gguf", wtype="f32").path
    values = decoded_draft(path, cfg)
    base = gguf_metadata(cfg, 32768)
    cases = {  # what is wrong -> (keys, tensors, kind, words in the message)
        "a DFlash variant's key": ({**base, f"{GGUF_ARCH}.dflash.domino.enabled": ("uint32", 1)}, values,
                                   "unsupported", "dflash.domino.enabled"),
        "no rope base": ({k: v for k, v in base.items() if not k.endswith("rope.freq_base")}, values,
                         "load", "missing key 'qwen35-dflash-draft.rope.freq_base'"),
        "a layer too many": ({**base, f"{GGUF_ARCH}.block_count": ("uint32", 3)}, values, "load",
                             "missing tensor 'blk.2.attn_norm.weight'"),
        "a misshapen matrix": (base, {**values, "layers.1.mlp.up_proj.weight":
                                      (values["layers.1.mlp.up_proj.weight"][0][:-1], gguf.GGMLQuantizationType.F32)},
                               "load", "blk.1.ffn_up.weight"),
    }
    for what, (keys, tensors, kind, words) in cases.items():
        bad = tmp_path / "bad.gguf"
        bad.unlink(missing_ok=True)
        write_draft_gguf(bad, cfg, tensors, name=what, file_type=0, keys=keys)
        line = load_error(dflash_exe, target, bad)
        assert line["kind"] == kind and words in line["message"], (what, line)


def test_convert_draft_cli(cli, pair, tmp_path):
    _, draft = pair
    out = tmp_path / "d.gguf"
    code, _, err = cli(["models", "convert-draft", str(draft), str(out), "--type", "q8_0"])
    assert code == 0 and out.is_file() and "Q8_0" in err, err
    code, _, err = cli(["models", "convert-draft", str(draft), str(out)])
    assert code != 0 and "--force" in err
    code, _, err = cli(["models", "convert-draft", str(draft), str(out), "--force", "--type", "q4_0"])
    assert code != 0 and "bf16, f16, f32, q8_0" in err
    code, _, err = cli(["models", "convert-draft", str(tmp_path), str(tmp_path / "x.gguf")])
    assert code != 0 and "config.json" in err
    r = gguf.GGUFReader(str(out))
    assert r.fields["general.architecture"].contents() == GGUF_ARCH
