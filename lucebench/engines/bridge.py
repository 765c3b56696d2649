"""The harness side of PFlash's vocabulary bridge (docs/engines.md, "PFlash"): the request fields that let
the engine map the drafter's kept tokens onto the target's tokens by character offsets.

The prompt's text is the decoding of the target ids the request already carries (every engine of a
comparison sees those ids; a needle prompt is assembled from ids, so its text comes from them too). Each
target id's character span is found by decoding the ids one at a time with the tokenizer's incremental
decoder (`tokenizers.decoders.DecodeStream`), so it describes exactly the ids sent, not a re-encoding of
the text; ids that end inside a multi-byte character share the span of the whole character. The drafter
encodes the same text with its own tokenizer, whose offsets the `tokenizers` library reports.
`kept_text_ids` is the other bridge, through text, for the harness: the kept text re-tokenised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from lucebench.errors import UserError


def target_offsets(tok: Tokenizer, ids: list[int]) -> tuple[str, list[list[int]]]:
    """The text of `ids` and each id's [start, end) character span in it (special tokens kept)."""
    stream = DecodeStream(skip_special_tokens=False)
    pieces: list[str] = []
    spans: list[list[int]] = []
    length = 0
    pending = 0  # ids whose bytes have not completed a character yet
    for i in ids:
        piece = stream.step(tok, i)
        if piece is None:
            pending += 1
            continue
        start = length
        length += len(piece)
        pieces.append(piece)
        spans.extend([start, length] for _ in range(pending + 1))
        pending = 0
    spans.extend([length, length] for _ in range(pending))  # trailing ids of no complete character
    text = "".join(pieces)
    if text != tok.decode(ids, skip_special_tokens=False):
        raise UserError("the target tokenizer's incremental decoding of the prompt differs from its decoding, so "
                        "the PFlash bridge cannot place its tokens in the text",
                        hint="a byte-level BPE tokenizer.json (as Qwen's) is what the bridge expects")
    return text, spans


def pflash_fields(target: Tokenizer, drafter: Tokenizer, ids: list[int]) -> dict[str, Any]:
    """`drafter_ids`, `drafter_offsets` and `target_offsets` of a PFlash request for the target ids `ids`."""
    text, spans = target_offsets(target, ids)
    enc = drafter.encode(text, add_special_tokens=False)
    if not enc.ids:  # a prompt of no text (ids the tokenizer does not know): the drafter still needs a token
        raise UserError("the prompt decodes to no text, so the PFlash drafter has nothing to score",
                        hint="give a prompt of real text")
    return {"drafter_ids": list(enc.ids), "drafter_offsets": [list(o) for o in enc.offsets], "target_offsets": spans}


def kept_text_ids(target: Tokenizer, ids: list[int], kept_char_ranges: list[list[int]]) -> list[int]:
    """The other bridge, through text (Lucebox's): the kept character ranges of the prompt's text joined and
    re-tokenised by the target's tokenizer. For comparing with the offset bridge's kept ids, or for sending
    the kept prompt to an engine without a compressor."""
    text, _ = target_offsets(target, ids)
    kept = "".join(text[a:b] for a, b in kept_char_ranges)
    return list(target.encode(kept, add_special_tokens=False).ids)


class PFlashBridge:
    """The two tokenizers of a PFlash cell, loaded once: target (the model's folder) and drafter (its own)."""

    def __init__(self, target_dir: Path, drafter_dir: Path):
        self.target = _load(target_dir, "model")
        self.drafter = _load(drafter_dir, "drafter")

    def fields(self, ids: list[int]) -> dict[str, Any]:
        return pflash_fields(self.target, self.drafter, ids)


def _load(folder: Path, role: str) -> Tokenizer:
    path = folder / "tokenizer.json" if folder.is_dir() else folder.parent / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"the {role} has no tokenizer.json, which PFlash needs to bridge the two vocabularies",
                        where=str(folder))
    return Tokenizer.from_file(str(path))
