"""Named shapes: the real ones match the published configs, and transformers accepts every one."""

from __future__ import annotations

import pytest

from lucebench.errors import UserError
from lucebench.models.shapes import QWEN3_5_SPECIAL_IDS, SHAPES, get_shape, shape_from_config
from lucebench.models.weights import n_params


def test_qwen35_08b_matches_the_published_config():
    c = get_shape("qwen3.5-0.8b").config
    assert (c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["vocab_size"]) == (24, 1024, 3584, 248320)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (8, 2, 256)
    assert (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"]) == (16, 16, 128)
    assert c["tie_word_embeddings"] is True
    assert [i for i, t in enumerate(c["layer_types"]) if t == "full_attention"] == [3, 7, 11, 15, 19, 23]
    assert c["rope_parameters"]["rope_theta"] == 10000000 and c["rope_parameters"]["partial_rotary_factor"] == 0.25
    # Parameter count of the text model, tied embeddings counted once.
    assert n_params(c) == 752_393_024


def test_qwen35_27b_and_qwen3_06b():
    c = get_shape("qwen3.5-27b").config
    assert (c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"]) == (64, 5120, 17408)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["linear_num_value_heads"]) == (24, 4, 48)
    assert c["tie_word_embeddings"] is False
    assert 53e9 < n_params(c) * 2 < 55e9  # ~54 GB in bf16
    q = get_shape("qwen3-0.6b")
    assert q.arch == "qwen3" and q.config["num_hidden_layers"] == 28 and q.config["vocab_size"] == 151936
    assert q.special_ids["<|im_end|>"] == 151645


def test_real_special_ids_where_the_vocab_allows():
    assert get_shape("qwen3.5-0.8b").special_ids == QWEN3_5_SPECIAL_IDS
    tiny = get_shape("tiny")
    assert max(tiny.special_ids.values()) < tiny.config["vocab_size"]
    assert min(tiny.special_ids.values()) == tiny.bpe_vocab
    assert tiny.eos_ids == [tiny.special_ids["<|im_end|>"], tiny.special_ids["<|endoftext|>"]]


@pytest.mark.parametrize("name", list(SHAPES))
def test_transformers_accepts_every_shape(name):
    from transformers import AutoConfig

    shape = get_shape(name)
    cfg = AutoConfig.for_model(**shape.config)
    assert cfg.num_hidden_layers == shape.config["num_hidden_layers"]
    if shape.arch == "qwen3_5":
        assert cfg.layer_types == shape.config["layer_types"]


def test_unknown_shape_is_a_user_error():
    with pytest.raises(UserError, match="unknown model shape"):
        get_shape("qwen9")


def test_shape_from_config_accepts_multimodal_and_places_specials():
    s = shape_from_config({"text_config": {"model_type": "qwen3_5_text", "vocab_size": 600, "hidden_size": 32,
                                           "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                                           "num_key_value_heads": 1}})
    assert s.config["layer_types"] == ["linear_attention", "linear_attention"]
    assert all(s.bpe_vocab <= i < 600 for i in s.special_ids.values())
    with pytest.raises(UserError, match="lacks"):
        shape_from_config({"model_type": "qwen3", "vocab_size": 1000})
    with pytest.raises(UserError, match="not supported"):
        shape_from_config({"model_type": "llama", "vocab_size": 1000})
