"""Synthetic speed workloads: `pp{N}` (prefill N tokens, n_gen 1) and `tg{N}` (N timed decode steps).

The prompt is a fixed English sentence repeated and cut to an exact token count by the target's
tokenizer (upstream's pp520). The repeated text is encoded once as a whole, so the ids are the
tokenizer's natural ids for that text, not a concatenation of separately encoded pieces.
"""

from __future__ import annotations

from lucebench.suites.base import Prompt
from lucebench.suites.tokenization import ModelTokenizer


def repeated_ids(tok: ModelTokenizer, sentence: str, n_tokens: int) -> list[int]:
    """Exactly `n_tokens` ids of `sentence` repeated (space separated), no special tokens added."""
    unit = " " + sentence.strip()
    per = max(1, len(tok.encode(unit, add_special_tokens=False)))
    copies = n_tokens // per + 2
    while True:
        ids = tok.encode(unit * copies, add_special_tokens=False)
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
        copies *= 2  # merges across copies made it shorter than estimated; rare, so just retry larger


def pp_prompt(tok: ModelTokenizer, *, name: str, sentence: str, length: int) -> Prompt:
    """The prefill prompt: `length` tokens."""
    return Prompt(id=name, token_ids=repeated_ids(tok, sentence, length))


def tg_prompt(tok: ModelTokenizer, *, name: str, sentence: str, context: int) -> Prompt:
    """The decode prompt: `context` tokens already in the cache before the timed decode steps."""
    return Prompt(id=name, token_ids=repeated_ids(tok, sentence, context))
