"""Byte-level BPE tokenizers trained on the corpus (`tokenizers`), saved as Hugging Face tokenizer.json.

The special tokens take the first ids (the trainer's order), so every id below `vocab_size` is a real token.
The target's list ends with `<|mask|>`, the DFlash draft's mask token: reserved here so that the target's
embedding table (which the draft reads its block input from) has a row for it.
"""

from __future__ import annotations

import json
from pathlib import Path

from lucebench.models.tokenizer import _SPLIT_PATTERN

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
MASK_TOKEN = "<|mask|>"
EOS_TOKEN = "<|endoftext|>"  # documents are separated by it; a base model's stop token


def train_bpe(texts: list[str], *, vocab_size: int, specials: list[str]):
    """A byte-level BPE with Qwen's pre-tokenisation split; `vocab_size` counts the special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=specials)
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"BPE trained to {tok.get_vocab_size()} tokens, not {vocab_size} (corpus too small)")
    return tok


def save_tokenizer(tok, out: Path, *, model_max_length: int) -> None:
    """tokenizer.json and a tokenizer_config.json that transformers' PreTrainedTokenizerFast reads."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    specials = [t for t in _all_specials() if tok.token_to_id(t) is not None]
    decoder = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
               for t in sorted(specials, key=tok.token_to_id)}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _all_specials() -> set[str]:
    return set(CHATML_SPECIALS) | {MASK_TOKEN}


def encode_documents(tok, texts: list[str], eos_id: int):
    """One int32 token stream: each document's ids followed by the end-of-text id."""
    import numpy as np

    encs = tok.encode_batch(texts, add_special_tokens=False)
    parts = []
    for e in encs:
        parts.append(np.asarray(e.ids, dtype=np.int32))
        parts.append(np.asarray([eos_id], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
