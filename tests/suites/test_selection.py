"""Deterministic row selection, pinned."""

from __future__ import annotations

import datasets

from lucebench.suites.selection import select_indices

# The 10 rows per suite, by the suites' rule (shuffle, seed 42). Changing these changes every result.
PINNED = {
    "humaneval": ["HumanEval/52", "HumanEval/134", "HumanEval/51", "HumanEval/66", "HumanEval/147",
                  "HumanEval/101", "HumanEval/24", "HumanEval/125", "HumanEval/145", "HumanEval/50"],
    "gsm8k": [f"gsm8k/test/{i}" for i in (30, 754, 429, 1010, 1284, 953, 751, 954, 705, 993)],
    "math500": [f"math500/test/{i}" for i in (473, 132, 472, 46, 40, 232, 45, 428, 326, 159)],
}
ROWS = {"humaneval": ("HumanEval/", 164), "gsm8k": ("gsm8k/test/", 1319), "math500": ("math500/test/", 500)}


def test_pinned_ids_per_suite() -> None:
    for suite, (prefix, n) in ROWS.items():
        ids = [f"{prefix}{i}" for i in range(n)]
        chosen = select_indices(ids, method="shuffle", seed=42, sample_size=10)
        assert [ids[i] for i in chosen] == PINNED[suite], suite


def test_shuffle_is_datasets_shuffle_so_upstream_prompts_are_reproduced() -> None:
    ds = datasets.Dataset.from_dict({"i": list(range(1319))})
    assert ds.shuffle(seed=42).select(range(10))["i"] == select_indices(
        [str(i) for i in range(1319)], method="shuffle", seed=42, sample_size=10)


def test_sha256_order_is_fixed_and_prefix_stable() -> None:
    ids = [f"r{i}" for i in range(50)]
    first = select_indices(ids, method="sha256", seed=7, sample_size=5)
    assert first == select_indices(ids, method="sha256", seed=7, sample_size=20)[:5]
    assert first != select_indices(ids, method="sha256", seed=8, sample_size=5)
    assert first == [8, 27, 12, 21, 37]


def test_first_and_oversized_samples() -> None:
    ids = [str(i) for i in range(4)]
    assert select_indices(ids, method="first", seed=0, sample_size=None) == [0, 1, 2, 3]
    assert sorted(select_indices(ids, method="shuffle", seed=1, sample_size=99)) == [0, 1, 2, 3]
