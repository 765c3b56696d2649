"""The long-context suites: single needle (ours and upstream Lucebox's format), multi-needle, variable
tracking and code filler; exact lengths in the model's own tokens, recorded needle spans, scoring, retention."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lucebench.errors import UserError
from lucebench.suites import prepare_workload, workload_identity
from lucebench.suites.needle import needles_kept
from lucebench.suites.registry import resolve_suite
from lucebench.suites.scoring import score_needle
from lucebench.suites.spec import validate_suite
from lucebench.suites.tokenization import load_tokenizer

SUITES = ["needle", "needle-lucebox", "needle-multi", "needle-vt", "needle-code", "needle-code-copy"]


@pytest.mark.parametrize("suite", SUITES)
def test_every_long_context_suite_covers_8k_to_128k_with_spread_depths(suite: str) -> None:
    nd = resolve_suite(suite).spec.needle
    assert nd is not None and nd.cases_per_length >= 5
    assert nd.lengths == [8192, 16384, 32768, 65536, 131072]
    assert min(nd.depths) <= 0.1 and max(nd.depths) >= 0.9 and len(set(nd.depths)) >= 5


@pytest.mark.parametrize("suite", SUITES)
def test_needle_spans_point_at_the_needles_and_lengths_are_exact(model_dir: Path, suite: str) -> None:
    tok = load_tokenizer(model_dir)
    w = prepare_workload(suite, tokenizer_dir=model_dir, context=8192)
    assert len(w.prompts) == 5 and all(len(p.token_ids) == 8192 for p in w.prompts)
    for p in w.prompts:
        text = tok.decode(p.token_ids)
        ref = p.reference
        starts = []
        for n in ref["needles"]:
            a, b = n["token_span"]
            ca, cb = n["char_span"]
            assert tok.decode(p.token_ids[a:b]).strip() == n["text"]
            assert text[ca:cb] == n["text"] and text.count(n["text"]) == 1
            # Placed at a filler boundary near the wanted depth (code pieces are longer than sentences).
            assert abs(a / 8192 - n["depth"]) < (0.08 if suite.startswith("needle-code") else 0.03), (a, n["depth"])
            starts.append(a)
        assert starts == sorted(starts)
        # The gold answers score correct, and a missing one does not.
        assert score_needle(p, " ".join(ref["answers"]), {})["correct"]
        assert not score_needle(p, " ".join(ref["answers"][1:]) + " 1", {})["correct"]


def test_depths_are_spread_over_each_lengths_cases(model_dir: Path) -> None:
    w = prepare_workload("needle-lucebox", tokenizer_dir=model_dir, context=16384)
    assert sorted(p.reference["needles"][0]["depth"] for p in w.prompts) == [0.1, 0.3, 0.5, 0.7, 0.9]


def test_upstream_lucebox_format(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    w = prepare_workload("needle-lucebox", tokenizer_dir=model_dir, context=8192)
    for p in w.prompts:
        text = tok.decode(p.token_ids)
        key = p.reference["needle_key"]
        assert re.fullmatch(r"[a-z]{8}", key) and re.fullmatch(r"\d{7}", p.reference["needle_value"])
        assert text.startswith("Below is a long passage. Answer the question at the end based ONLY on information "
                               "in the passage.\n\n The grass is green. The sky is blue. The sun is yellow.")
        assert f"The special magic {key} number is: {p.reference['needle_value']}." in text
        assert text.endswith(f"\n\nQuestion: What is the special magic {key} number? Answer in one short sentence."
                             f"\nAnswer:")


def test_multi_needle_cases(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    w = prepare_workload("needle-multi", tokenizer_dir=model_dir, context=8192)
    for p in w.prompts:
        needles = p.reference["needles"]
        keys = [n["key"] for n in needles]
        assert len(needles) == 4 and len(set(keys)) == 4 and len({n["depth"] for n in needles}) == 4
        assert p.reference["answers"] == [n["value"] for n in needles]
        assert f"passcodes for {', '.join(keys[:3])} and {keys[3]}?" in tok.decode(p.token_ids)[-400:]


def test_variable_tracking_chain_is_in_order(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    w = prepare_workload("needle-vt", tokenizer_dir=model_dir, context=8192)
    for p in w.prompts:
        needles = p.reference["needles"]
        names = [n["key"] for n in needles]
        value = needles[0]["value"]
        assert needles[0]["text"] == f"VAR {names[0]} = {value}."
        assert [n["text"] for n in needles[1:]] == [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
        assert p.reference["answers"] == names and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
        assert f"assigned the value {value}," in tok.decode(p.token_ids)[-400:]
        assert score_needle(p, "They are " + ", ".join(names) + ".", {})["correct"]
        assert not score_needle(p, "They are " + ", ".join(names[:-1]) + "X" + names[-1], {})["correct"]


def test_code_filler_keeps_the_code_and_puts_the_needle_on_its_own_line(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    w = prepare_workload("needle-code", tokenizer_dir=model_dir, context=8192)
    for p in w.prompts:
        text = tok.decode(p.token_ids)
        ca, cb = p.reference["needles"][0]["char_span"]
        assert text[ca - 2:ca] == "\n\n" and text[cb:cb + 2] == "\n\n"
        assert text.startswith("Here is a Python module.\n\n")
        assert "    def push(self, item):\n        self._items.append(item)" in text


def test_code_copy_asks_in_code(model_dir: Path) -> None:
    """needle-code-copy: the needle an assignment on its own line, the prompt ending with its name and "=" again,
    so that the value is the continuation (a small code model copies it; it cannot follow an English question)."""
    tok = load_tokenizer(model_dir)
    w = prepare_workload("needle-code-copy", tokenizer_dir=model_dir, context=8192)
    for p in w.prompts:
        text = tok.decode(p.token_ids)
        n = p.reference["needles"][0]
        ca, cb = n["char_span"]
        assert text[ca:cb] == f"passcode_{n['key']} = {n['value']}" and text[cb:cb + 2] == "\n\n"
        assert text.endswith(f"\n\npasscode_{n['key']} =") and text.count(n["key"]) == 2
        assert p.reference["answers"] == [n["value"]]


def test_deterministic_by_seed_and_lengths_in_the_models_own_tokens(model_dir: Path, tmp_path: Path,
                                                                    helpers) -> None:
    a = prepare_workload("needle-vt", tokenizer_dir=model_dir, context=4096)
    b = prepare_workload("needle-vt", tokenizer_dir=model_dir, context=4096)
    assert workload_identity(a) == workload_identity(b) and [p.reference for p in a.prompts] == [
        p.reference for p in b.prompts]
    other_seed = helpers.write_suite(tmp_path / "s", "needle-vt", needle__seed=7)
    c = prepare_workload(str(other_seed), tokenizer_dir=model_dir, context=4096)
    assert [p.reference["answers"] for p in c.prompts] != [p.reference["answers"] for p in a.prompts]
    # Another tokenizer (it adds a BOS token): the same cases, exactly as long in its own tokens.
    bos_dir = helpers.make_model_dir(tmp_path / "bos", bos=True)
    d = prepare_workload("needle-vt", tokenizer_dir=bos_dir, context=4096)
    assert all(len(p.token_ids) == 4096 for p in d.prompts)
    assert d.prompts[0].token_ids[0] == load_tokenizer(bos_dir).tokenizer.token_to_id("<s>")
    assert [p.reference["answers"] for p in d.prompts] == [p.reference["answers"] for p in a.prompts]


def test_128k_code_prompts_build_in_seconds(model_dir: Path) -> None:
    import time

    start = time.perf_counter()
    w = prepare_workload("needle-code", tokenizer_dir=model_dir, context=131072)
    assert time.perf_counter() - start < 10.0
    assert all(len(p.token_ids) == 131072 for p in w.prompts)


def test_needle_retention_from_kept_ranges() -> None:
    ref = {"needles": [{"token_span": [100, 110]}, {"token_span": [500, 520]}, {"token_span": [900, 905]}]}
    # Adjacent ranges merge; a needle cut at either end is lost.
    assert needles_kept(ref, [(0, 64), (96, 105), (105, 128), (510, 600), (900, 905)]) == [True, False, True]
    assert needles_kept(ref, []) == [False, False, False]
    assert needles_kept({"needle_value": "1"}, [(0, 10)]) is None


@pytest.mark.parametrize(("changes", "message"), [
    ({"mode": "multi", "needles_per_case": 1}, "needles_per_case >= 2"),
    ({"mode": "variable_tracking", "needles_per_case": 3}, "hop"),
    ({"needles_per_case": 2}, "one needle"),
    ({"mode": "multi", "needles_per_case": 6}, "at least needles_per_case depths"),
])
def test_bad_needle_sections_are_user_errors(changes: dict, message: str) -> None:
    import yaml

    data = yaml.safe_load(resolve_suite("needle").path.read_text())
    data["needle"].update(changes)
    with pytest.raises(UserError, match=message):
        validate_suite(data, where="needle.yaml")
