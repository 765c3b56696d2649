"""Needle in a haystack: long prompts of an exact token length with one key/value sentence hidden inside.

Built from token ids, not strings: each filler sentence is encoded once per tokenizer, the haystack is
those ids cycled and cut, the needle's ids are spliced in at a sentence boundary near the wanted depth.
A 128K-token prompt therefore costs list operations, not a 128K-token tokenisation.
Ids are assembled piecewise (head | haystack | needle | haystack | question), so they can differ from
encoding the decoded text in one go at the seams; every engine still receives the same ids.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from lucebench.errors import UserError
from lucebench.suites.base import Prompt
from lucebench.suites.formats import chat_text
from lucebench.suites.spec import Needle, PromptFormat
from lucebench.suites.tokenization import ModelTokenizer

_SLOT = "\x00HAYSTACK\x00"  # stands for the haystack while the chat template renders


@dataclass(frozen=True)
class NeedleCase:
    """One generated case before tokenisation."""

    length: int
    index: int
    key: str
    value: str
    depth: float
    start_sentence: int


def make_case(spec: Needle, length: int, index: int) -> NeedleCase:
    """The case's random choices, from a generator seeded with (seed, length, index) only."""
    rng = np.random.default_rng([spec.seed, length, index])
    key = spec.keys[int(rng.integers(len(spec.keys)))]
    lo = 10 ** (spec.value_digits - 1)
    value = str(int(rng.integers(lo, 10 * lo)))
    return NeedleCase(length=length, index=index, key=key, value=value,
                      depth=spec.depths[index % len(spec.depths)],
                      start_sentence=int(rng.integers(len(spec.filler))))


_FILLER_CACHE: dict[tuple[str, tuple[str, ...]], list[list[int]]] = {}


def _filler_ids(tok: ModelTokenizer, filler: tuple[str, ...]) -> list[list[int]]:
    # Cached per tokenizer (by its sha256) and filler: encoded once, reused by every case and length.
    key = (tok.sha256, filler)
    if key not in _FILLER_CACHE:
        if len(_FILLER_CACHE) > 8:
            _FILLER_CACHE.clear()
        _FILLER_CACHE[key] = tok.encode_batch([" " + s.strip() for s in filler], add_special_tokens=False)
    return _FILLER_CACHE[key]


def _frame(tok: ModelTokenizer, fmt: PromptFormat, question: str) -> tuple[list[int], list[int]]:
    """Ids before and after the haystack: special tokens / chat template head, and the question tail."""
    if fmt.format == "chat":
        text = chat_text(_SLOT + "\n\n" + question, fmt, tok)
        head, _, tail = text.partition(_SLOT)
        return tok.encode(head, add_special_tokens=False), tok.encode(tail, add_special_tokens=False)
    # raw: keep the tokenizer's own special tokens (BOS, ...) around the text, as `tokenizer(text)` would.
    plain = tok.encode("x", add_special_tokens=False)
    full = tok.encode("x", add_special_tokens=True)
    pos = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), 0)
    prefix, suffix = full[:pos], full[pos + len(plain):]
    return prefix, tok.encode("\n\n" + question + "\nAnswer:", add_special_tokens=False) + suffix


def build_case(tok: ModelTokenizer, spec: Needle, fmt: PromptFormat, case: NeedleCase, *, suite: str) -> Prompt:
    """The prompt of one case: exactly `case.length` ids, needle value in `reference`."""
    needle_ids = tok.encode(" " + spec.needle.format(key=case.key, value=case.value), add_special_tokens=False)
    head, tail = _frame(tok, fmt, spec.question.format(key=case.key))
    hay_len = case.length - len(head) - len(tail) - len(needle_ids)
    if hay_len < 1:
        raise UserError(f"needle length {case.length} is too short for the question and needle "
                        f"({case.length - hay_len} tokens)", where=f"suite {suite}")
    sentences = _filler_ids(tok, tuple(spec.filler))
    hay: list[int] = []
    bounds: list[int] = [0]  # token offsets where a sentence starts
    i = case.start_sentence
    while len(hay) < hay_len:
        hay.extend(sentences[i % len(sentences)])
        bounds.append(len(hay))
        i += 1
    del hay[hay_len:]
    # Put the needle at the sentence boundary nearest the wanted depth (never mid-sentence).
    want = case.depth * hay_len
    j = bisect.bisect_left(bounds, want)
    candidates = [b for b in bounds[max(0, j - 1):j + 1] if b <= hay_len]
    at = min(candidates, key=lambda b: abs(b - want)) if candidates else 0
    ids = head + hay[:at] + needle_ids + hay[at:] + tail
    assert len(ids) == case.length  # construction invariant, not a user error
    return Prompt(id=f"{suite}/{case.length}/{case.index}", token_ids=ids, text=None,
                  reference={"needle_key": case.key, "needle_value": case.value, "depth": case.depth,
                             "needle_token_offset": len(head) + at, "length": case.length})


def needle_prompts(tok: ModelTokenizer, spec: Needle, fmt: PromptFormat, *, suite: str,
                   lengths: list[int], cases: int) -> list[Prompt]:
    """All cases for the given lengths, in (length, index) order."""
    return [build_case(tok, spec, fmt, make_case(spec, length, i), suite=suite)
            for length in lengths for i in range(cases)]


def needles_kept(reference: dict, kept_ranges: list[tuple[int, int]]) -> list[bool] | None:
    """Per needle of a prompt, whether every one of its tokens lies in the kept ranges (half-open, over the
    prompt's positions, ascending): the retention check of a compressed prefill, independent of the answer.
    None for a prompt without needles."""
    needles = reference.get("needles")
    if not needles:
        return None
    merged: list[list[int]] = []
    for a, b in sorted(kept_ranges):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = [m[0] for m in merged]

    def covered(a: int, b: int) -> bool:
        i = bisect.bisect_right(starts, a) - 1
        return i >= 0 and merged[i][1] >= b

    return [covered(*n["token_span"]) for n in needles]
