"""The synthetic tokenizer: deterministic, real special-token ids, a working chat template."""

from __future__ import annotations

import json

from lucebench.models.shapes import QWEN3_5_SPECIAL_IDS
from lucebench.models.tokenizer import _trained_bpe_json, build_tokenizer_json


def test_training_is_deterministic():
    first = _trained_bpe_json(512)
    _trained_bpe_json.cache_clear()
    assert _trained_bpe_json(512) == first
    assert len(json.loads(first)["model"]["vocab"]) == 512


def test_special_tokens_keep_the_real_ids_and_unknown_ids_decode_empty():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json.dumps(build_tokenizer_json(1024, QWEN3_5_SPECIAL_IDS)))
    assert tok.token_to_id("<|im_end|>") == 248046
    assert tok.token_to_id("<think>") == 248068
    enc = tok.encode("<|im_start|>user\ndef add(a, b):\n    return a + b<|im_end|>")
    assert enc.ids[0] == 248045 and enc.ids[-1] == 248046
    assert max(enc.ids[1:-1]) < 1024
    assert tok.decode(enc.ids, skip_special_tokens=False) == "<|im_start|>user\ndef add(a, b):\n    return a + b<|im_end|>"
    # Ids between the trained vocabulary and the specials are unknown: they decode to nothing.
    assert tok.decode([5000, 100000], skip_special_tokens=False) == ""


def test_chat_template_thinking_on_and_off(synth_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(synth_dir("tiny"))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    off = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert on == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
