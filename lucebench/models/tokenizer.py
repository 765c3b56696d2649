"""A real byte-level BPE tokenizer for synthetic checkpoints, trained locally and deterministically.

The regular vocabulary (256 byte tokens plus merges) takes ids ``0 .. bpe_vocab-1``; the Qwen special
tokens take the ids the shape gives (the real model's ids when the vocabulary holds them). Special
tokens are entered in the BPE model's vocabulary as well as in ``added_tokens`` because the tokenizers
library re-numbers added tokens that the model's vocabulary does not already hold.

Ids that the tokenizer does not know (the gap between the trained vocabulary and the special ids, or
any id above them) decode to the empty string.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from lucebench.models.corpus import corpus

# Qwen2/Qwen3's pre-tokenisation split (letters, single digits, punctuation runs, newlines, spaces).
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# A Qwen3-style ChatML template: `enable_thinking=False` closes an empty think block, as Qwen3's does.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


@functools.lru_cache(maxsize=8)
def _trained_bpe_json(bpe_vocab: int) -> str:
    """tokenizer.json text of the BPE trained on the embedded corpus (no special tokens yet)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    tok.train_from_iterator(corpus(), trainer)
    return tok.to_str()


def build_tokenizer_json(bpe_vocab: int, special_ids: dict[str, int]) -> dict[str, Any]:
    """The full tokenizer.json (as a dict) with the special tokens at ``special_ids``."""
    data = json.loads(_trained_bpe_json(bpe_vocab))
    vocab: dict[str, int] = data["model"]["vocab"]
    taken = set(vocab.values())
    added = []
    for content, idx in sorted(special_ids.items(), key=lambda kv: kv[1]):
        if idx in taken:
            raise ValueError(f"special token {content} id {idx} collides with the trained vocabulary")
        vocab[content] = idx
        added.append({"id": idx, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    data["added_tokens"] = added
    return data


def tokenizer_config(special_ids: dict[str, int], *, model_max_length: int) -> dict[str, Any]:
    """tokenizer_config.json: Qwen's token roles and the chat template."""
    decoder = {str(idx): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": True}
               for tok, idx in sorted(special_ids.items(), key=lambda kv: kv[1])}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
