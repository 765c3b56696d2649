"""DFlash drafts: the published layout for a target, random drafts that validate, both config placements."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from lucebench.errors import UserError
from lucebench.models.dflash_draft import (
    check_draft,
    default_target_layer_ids,
    draft_config_for,
    parse_draft_config,
    read_draft_config,
    synthesize_draft,
)
from lucebench.models.shapes import get_shape
from lucebench.models.synth import PROVENANCE_FILE

# The tensor names speculative.md §1 lists for a published draft, per layer and global.
LAYER_NAMES = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
               "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
               "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
               "mlp.down_proj.weight"]


def _n_params(cfg: dict) -> int:
    d = parse_draft_config(cfg)
    return sum(int(torch.tensor(s).prod()) for s in d.tensor_shapes().values())


def test_reference_rule_gives_the_published_ids_of_the_z_lab_drafts():
    assert default_target_layer_ids(64) == [1, 16, 31, 46, 61]
    assert default_target_layer_ids(32) == [1, 8, 15, 22, 29]
    assert default_target_layer_ids(36) == [1, 9, 17, 25, 33]
    # The community 0.8B draft does not follow the rule: a published match must win over it.
    assert default_target_layer_ids(24) == [1, 6, 11, 16, 21]


def test_qwen35_27b_target_gets_the_published_27b_draft():
    cfg = draft_config_for(get_shape("qwen3.5-27b").config)
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["intermediate_size"]) == (5120, 5, 32, 8, 128, 17408)
    assert cfg["dflash_config"] == {"target_layer_ids": [1, 16, 31, 46, 61], "mask_token_id": 248070}
    assert (cfg["block_size"], cfg["num_target_layers"], cfg["rope_theta"]) == (16, 64, 1e7)
    # About 1.73 B parameters (3.46 GB in bf16), as speculative.md derives for the published draft.
    assert 1.72e9 < _n_params(cfg) < 1.74e9


def test_other_published_targets_and_the_08b_ids():
    qwen3_8b = {"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "vocab_size": 151936,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
                "rope_theta": 1e6}
    c = draft_config_for(qwen3_8b)
    assert c["dflash_config"] == {"target_layer_ids": [1, 9, 17, 25, 33], "mask_token_id": 151669}
    assert c["rope_theta"] == 1e6
    c = draft_config_for(get_shape("qwen3.5-0.8b").config)
    assert c["dflash_config"] == {"target_layer_ids": [3, 7, 11, 15, 19], "mask_token_id": 248077}
    # Sizes the card does not give come from the target's own attention and MLP.
    assert (c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["intermediate_size"]) == (1024, 8, 256, 3584)


@pytest.fixture(scope="module")
def target_and_draft(tmp_path_factory) -> tuple[Path, Path]:
    from lucebench.models.synth import synthesize

    root = tmp_path_factory.mktemp("draft")
    target = synthesize(get_shape("small"), root / "target", seed=0, dtype="bf16").out_dir
    synthesize_draft(target, root / "draft", seed=3)
    return target, root / "draft"


def test_random_draft_has_the_published_names_and_validates(target_and_draft):
    target, draft = target_and_draft
    cfg = check_draft(draft, json.loads((target / "config.json").read_text()))
    t = get_shape("small").config
    assert cfg.num_target_layers == 8 and cfg.target_layer_ids == (1, 2, 3, 4, 5)
    assert cfg.hidden_size == t["hidden_size"] and cfg.vocab_size == t["vocab_size"] and cfg.block_size == 16
    # The mask id is one the target's tokenizer cannot produce: past its specials, inside the vocabulary.
    specials = get_shape("small").special_ids
    assert max(specials.values()) < cfg.mask_token_id < t["vocab_size"]
    with safe_open(str(draft / "model.safetensors"), "pt") as st:
        names = set(st.keys())
        assert st.get_slice("fc.weight").get_shape() == [256, 5 * 256]
        assert st.get_tensor("layers.0.self_attn.q_norm.weight").dtype == torch.bfloat16
    assert names == {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
        f"layers.{i}.{n}" for i in range(5) for n in LAYER_NAMES}
    prov = json.loads((draft / PROVENANCE_FILE).read_text())
    assert prov["kind"] == "dflash-draft" and prov["seed"] == 3 and prov["layout_of"] is None


def test_draft_layers_are_transformers_qwen3_layers(target_and_draft):
    """Each draft layer's names and shapes are those of transformers' Qwen3 decoder layer of the same sizes."""
    from transformers import Qwen3Config, Qwen3Model

    _, draft = target_and_draft
    raw = json.loads((draft / "config.json").read_text())
    qcfg = Qwen3Config(**{k: v for k, v in raw.items() if k not in ("architectures", "dflash_config")})
    with torch.device("meta"):
        model = Qwen3Model(qcfg)
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "embed_tokens.weight"}
    ours = {k: v for k, v in read_draft_config(draft).tensor_shapes().items() if not k.startswith(("fc.", "hidden_norm."))}
    assert ours == theirs


def test_same_seed_same_bytes(target_and_draft, tmp_path):
    target, draft = target_and_draft
    again = synthesize_draft(target, tmp_path / "again", seed=3)
    assert (again.out_dir / "model.safetensors").read_bytes() == (draft / "model.safetensors").read_bytes()
    other = synthesize_draft(target, tmp_path / "other", seed=4)
    assert (other.out_dir / "model.safetensors").read_bytes() != (draft / "model.safetensors").read_bytes()


def _published_like(**changes) -> dict:
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
           "vocab_size": 1000, "num_target_layers": 12}
    cfg.update(changes)
    return cfg


def test_both_placements_of_the_dflash_keys():
    nested = parse_draft_config(_published_like(block_size=16, dflash_config={"target_layer_ids": [1, 10],
                                                                              "mask_token_id": 999}))
    top = parse_draft_config(_published_like(block_size=16, target_layer_ids=[1, 10], mask_token_id=999))
    inside = parse_draft_config(_published_like(dflash_config={"block_size": 16, "target_layer_ids": [1, 10],
                                                               "mask_token_id": 999}))
    assert nested == top == inside
    # Without ids the reference rule over the draft's layer count applies.
    assert parse_draft_config(_published_like(mask_token_id=5)).target_layer_ids == (1, 9)


@pytest.mark.parametrize(("changes", "message"), [
    ({"architectures": ["Qwen3ForCausalLM"]}, "not a DFlash draft"),
    ({"model_type": "llama"}, "model_type"),
    ({"dflash_config": {"target_layer_ids": [1, 12], "mask_token_id": 3}}, "outside the target's layers"),
    ({"dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 1000}}, "mask_token_id"),
    ({"mask_token_id": 3, "block_size": 1}, "block_size"),
    ({"mask_token_id": 3, "num_attention_heads": 3}, "multiple"),
    ({"mask_token_id": 3, "layer_types": ["sliding_attention", "full_attention"]}, "sliding_window"),
])
def test_bad_configs_are_user_errors(changes, message):
    with pytest.raises(UserError, match=message):
        parse_draft_config(_published_like(**changes))


def test_broken_drafts_are_refused(target_and_draft, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    target, draft = target_and_draft
    broken = tmp_path / "broken"
    shutil.copytree(draft, broken)
    sd = load_file(broken / "model.safetensors")
    del sd["layers.4.mlp.up_proj.weight"]
    save_file(sd, broken / "model.safetensors")
    with pytest.raises(UserError, match="missing tensor layers.4.mlp.up_proj.weight"):
        check_draft(broken)
    sd["layers.4.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(sd, broken / "model.safetensors")
    with pytest.raises(UserError, match=r"layers.4.mlp.up_proj.weight has shape \[3, 3\]"):
        check_draft(broken)
    other_target = json.loads((target / "config.json").read_text()) | {"num_hidden_layers": 9}
    with pytest.raises(UserError, match="num_hidden_layers 8"):
        check_draft(draft, other_target)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lucebench", *args], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "COLUMNS": "400"})


def test_draft_for_through_the_command_line(target_and_draft, tmp_path):
    target, draft = target_and_draft
    proc = _cli("models", "synth", "--draft-for", str(target), "--out", str(tmp_path / "d"), "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "d" / "model.safetensors").read_bytes() == (draft / "model.safetensors").read_bytes()
    both = _cli("models", "synth", "--draft-for", str(target), "--shape", "tiny", "--out", str(tmp_path / "x"))
    assert both.returncode == 2 and "--draft-for" in both.stderr and "Traceback" not in both.stderr
    nowhere = _cli("models", "synth", "--draft-for", str(tmp_path / "nowhere"), "--out", str(tmp_path / "y"))
    assert nowhere.returncode == 2 and "config.json" in nowhere.stderr and "Traceback" not in nowhere.stderr
    (tmp_path / "m.gguf").write_bytes(b"GGUF")  # a single file: sized in a config from its synthetic shape only
    gguf = _cli("models", "synth", "--draft-for", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "z"))
    assert gguf.returncode == 2 and "draft_for" in gguf.stderr and "Traceback" not in gguf.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    full = _cli("models", "synth", "--draft-for", str(target), "--out", str(tmp_path / "full"))
    assert full.returncode == 2 and "refusing to replace" in full.stderr and (tmp_path / "full" / "notes.txt").exists()
