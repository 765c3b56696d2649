"""Needles in a haystack: long prompts of an exact token length with key/value sentences hidden inside.

Built from token ids, not strings: each filler piece (a sentence, or a block of code) is encoded once per
tokenizer, the haystack is those ids cycled and cut, each needle's ids are spliced in at a piece boundary
near its wanted depth. Every needle's token span and character span is recorded in the prompt's reference,
so that a compressed prefill's kept prompt can be checked for the needle independently of the answer.
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


_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


@dataclass(frozen=True)
class NeedleCase:
    """One generated case before tokenisation: its needles (in prompt order), question and answers."""

    length: int
    index: int
    needles: tuple[str, ...]  # the needle sentences, in the order they appear in the prompt
    depths: tuple[float, ...]  # wanted relative depth of each needle
    keys: tuple[str, ...]  # per needle: its key (single, multi) or variable name (variable_tracking)
    values: tuple[str, ...]  # per needle: its value ("" for a variable_tracking hop)
    question: str
    answers: tuple[str, ...]  # every one must appear in the output
    start_sentence: int

    # The single-needle view (the first needle), as the single mode's results have always recorded it.
    @property
    def key(self) -> str:
        return self.keys[0]

    @property
    def value(self) -> str:
        return self.values[0]

    @property
    def depth(self) -> float:
        return self.depths[0]


def _random_names(rng: np.random.Generator, n: int, letters: int, *, upper: bool = False) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice(_LETTERS, letters))
        name = name.upper() if upper else name
        if name not in names:
            names.append(name)
    return names


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def make_case(spec: Needle, length: int, index: int) -> NeedleCase:
    """The case's random choices, from a generator seeded with (seed, length, index) only."""
    rng = np.random.default_rng([spec.seed, length, index])
    lo = 10 ** (spec.value_digits - 1)
    n = spec.needles_per_case
    depths = [spec.depths[(index + j) % len(spec.depths)] for j in range(n)]
    if spec.mode == "single":
        key = (spec.keys[int(rng.integers(len(spec.keys)))] if spec.keys
               else _random_names(rng, 1, spec.key_letters)[0])
        value = str(int(rng.integers(lo, 10 * lo)))
        start = int(rng.integers(len(spec.filler))) if spec.random_start else 0
        return NeedleCase(length=length, index=index, needles=(spec.needle.format(key=key, value=value),),
                          depths=(depths[0],), keys=(key,), values=(value,), question=spec.question.format(key=key),
                          answers=(value,), start_sentence=start)
    if spec.mode == "multi":
        keys = ([spec.keys[int(i)] for i in rng.choice(len(spec.keys), n, replace=False)] if spec.keys
                else _random_names(rng, n, spec.key_letters))
        values = [str(int(v)) for v in rng.integers(lo, 10 * lo, n)]
        start = int(rng.integers(len(spec.filler))) if spec.random_start else 0
        # Prompt order follows depth; the question lists the keys in that order too.
        order = sorted(range(n), key=lambda j: depths[j])
        keys, values, depths = [keys[j] for j in order], [values[j] for j in order], [depths[j] for j in order]
        return NeedleCase(length=length, index=index,
                          needles=tuple(spec.needle.format(key=k, value=v) for k, v in zip(keys, values)),
                          depths=tuple(depths), keys=tuple(keys), values=tuple(values),
                          question=spec.question.format(keys=_join(keys)), answers=tuple(values),
                          start_sentence=start)
    # variable_tracking: the chain must be read in order, so its links sit at ascending depths.
    names = _random_names(rng, n, spec.key_letters, upper=True)
    value = str(int(rng.integers(lo, 10 * lo)))
    start = int(rng.integers(len(spec.filler))) if spec.random_start else 0
    assert spec.hop is not None
    needles = [spec.needle.format(var=names[0], value=value)] + [
        spec.hop.format(var=names[j], prev=names[j - 1]) for j in range(1, n)]
    return NeedleCase(length=length, index=index, needles=tuple(needles), depths=tuple(sorted(depths)),
                      keys=tuple(names), values=(value,) + ("",) * (n - 1), question=spec.question.format(value=value),
                      answers=tuple(names), start_sentence=start)


_FILLER_CACHE: dict[tuple[str, tuple[str, ...], str], list[list[int]]] = {}


def _piece(text: str, sep: str) -> str:
    # Prose pieces are normalised to one space before each; code pieces are kept verbatim.
    return sep + (text.strip() if sep == " " else text)


def _filler_ids(tok: ModelTokenizer, filler: tuple[str, ...], sep: str) -> list[list[int]]:
    # Cached per tokenizer (by its sha256) and filler: encoded once, reused by every case and length.
    key = (tok.sha256, filler, sep)
    if key not in _FILLER_CACHE:
        if len(_FILLER_CACHE) > 8:
            _FILLER_CACHE.clear()
        _FILLER_CACHE[key] = tok.encode_batch([_piece(s, sep) for s in filler], add_special_tokens=False)
    return _FILLER_CACHE[key]


def _frame(tok: ModelTokenizer, spec: Needle, fmt: PromptFormat, question: str) -> tuple[list[int], list[int]]:
    """Ids before and after the haystack: special tokens / chat template head, preamble, and the question tail."""
    if fmt.format == "chat":
        text = chat_text(spec.preamble + _SLOT + "\n\n" + spec.question_prefix + question, fmt, tok)
        head, _, tail = text.partition(_SLOT)
        return tok.encode(head, add_special_tokens=False), tok.encode(tail, add_special_tokens=False)
    # raw: keep the tokenizer's own special tokens (BOS, ...) around the text, as `tokenizer(text)` would.
    plain = tok.encode("x", add_special_tokens=False)
    full = tok.encode("x", add_special_tokens=True)
    pos = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), 0)
    prefix, suffix = full[:pos], full[pos + len(plain):]
    head = prefix + (tok.encode(spec.preamble, add_special_tokens=False) if spec.preamble else [])
    tail = tok.encode("\n\n" + spec.question_prefix + question + spec.answer_cue, add_special_tokens=False)
    return head, tail + suffix


def build_case(tok: ModelTokenizer, spec: Needle, fmt: PromptFormat, case: NeedleCase, *, suite: str) -> Prompt:
    """The prompt of one case: exactly `case.length` ids; every needle's token and character span recorded.

    Character spans index the decoded prompt (`tokenizer.decode(token_ids)`, special tokens kept) and cover
    the needle sentence itself, without the separator before it.
    """
    sep = spec.filler_separator
    needle_ids = tok.encode_batch([_piece(t, sep) for t in case.needles], add_special_tokens=False)
    head, tail = _frame(tok, spec, fmt, case.question)
    hay_len = case.length - len(head) - len(tail) - sum(len(n) for n in needle_ids)
    if hay_len < 1:
        raise UserError(f"needle length {case.length} is too short for the question and needles "
                        f"({case.length - hay_len} tokens)", where=f"suite {suite}")
    sentences = _filler_ids(tok, tuple(spec.filler), sep)
    hay: list[int] = []
    bounds: list[int] = [0]  # token offsets where a filler piece starts
    i = case.start_sentence
    while len(hay) < hay_len:
        hay.extend(sentences[i % len(sentences)])
        bounds.append(len(hay))
        i += 1
    del hay[hay_len:]
    bounds = [b for b in bounds if b <= hay_len]
    # Each needle goes to the piece boundary nearest its wanted depth (never mid-piece), in case order.
    at: list[int] = []
    for depth in case.depths:
        want = depth * hay_len
        j = bisect.bisect_left(bounds, want)
        b = min(bounds[max(0, j - 1):j + 1], key=lambda x: abs(x - want))
        at.append(max(b, at[-1]) if at else b)
    ids = list(head)
    spans: list[tuple[int, int]] = []
    prev = 0
    for pos, nid in zip(at, needle_ids):
        ids += hay[prev:pos]
        spans.append((len(ids), len(ids) + len(nid)))
        ids += nid
        prev = pos
    ids += hay[prev:] + tail
    assert len(ids) == case.length  # construction invariant, not a user error
    needles = []
    for text, key, value, depth, (a, b) in zip(case.needles, case.keys, case.values, case.depths, spans):
        ca, cb = len(tok.decode(ids[:a])), len(tok.decode(ids[:b]))
        piece = tok.decode(ids[a:b])
        ca += len(piece) - len(piece.lstrip())
        needles.append({"text": text, "key": key, "value": value, "depth": depth, "token_span": [a, b],
                        "char_span": [ca, cb]})
    ref: dict[str, object] = {"mode": spec.mode, "answers": list(case.answers), "needles": needles,
                              "length": case.length}
    if spec.mode == "single":
        ref.update({"needle_key": case.key, "needle_value": case.value, "depth": case.depth,
                    "needle_token_offset": spans[0][0]})
    return Prompt(id=f"{suite}/{case.length}/{case.index}", token_ids=ids, text=None, reference=ref)


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
