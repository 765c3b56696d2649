"""The draft's training data: function-body prefixes (where a HumanEval prompt ends) and the features stored
while the target generates its continuations (the same as a batched forward over the finished sequences)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lucebench.models.dflash_reference import FeatureTarget  # noqa: E402
from lucebench.models.train.draft_train import (  # noqa: E402
    block_batch,
    function_body_prefixes,
    function_body_starts,
    greedy_continuations,
    stream_prefixes,
)
from lucebench.models.train.lm import LMRecipe, build_model  # noqa: E402

SOURCE = '''import os


def f(a: int,
      b: int) -> int:
    """ Add.
    >>> f(1, 2)
    3
    """
    return a + b


def g():
    \'\'\'One line.\'\'\'
    pass


class C:
    """Not a function."""
    x = 1

    def h(self):
        """No body follows."""

def k():
    # no docstring
    return 1
'''


def test_function_body_starts_after_function_docstrings_only():
    ends = function_body_starts(SOURCE)
    assert [SOURCE[e:].split("\n", 1)[0] for e in ends] == ["    return a + b", "    pass"]
    assert [SOURCE[:e].splitlines()[-1] for e in ends] == ['    """', "    '''One line.'''"]


class _CharTokenizer:
    """One id per character (enough to check the windows), with the tokenizers API used here."""

    class _Enc:
        def __init__(self, ids):
            self.ids = ids

    def encode_batch(self, texts, add_special_tokens=False):
        return [self._Enc([10 + ord(c) % 200 for c in t]) for t in texts]


def test_function_body_prefixes_end_where_the_body_starts():
    texts = ["tail of the previous file\n", SOURCE]
    rows = function_body_prefixes(_CharTokenizer(), texts, n=8, prefix_len=40, eos_id=0, seed=0)
    assert rows.shape == (2, 40)
    ends = {tuple(10 + ord(c) % 200 for c in SOURCE[e - 40:e]) for e in function_body_starts(SOURCE)}
    assert {tuple(r) for r in rows} == ends
    # A place near the start of its file is preceded by the previous file and end-of-text.
    short = function_body_prefixes(_CharTokenizer(), texts, n=8, prefix_len=100, eos_id=0, seed=0)
    first = [r for r in short if 0 in r.tolist()]
    assert len(function_body_prefixes(_CharTokenizer(), texts, n=8, prefix_len=130, eos_id=0, seed=0)) == 1  # too short
    assert len(short) == 2 and len(first) == 1 and first[0].tolist().index(0) == 100 - 1 - len(SOURCE[:function_body_starts(SOURCE)[0]])


def test_stored_features_equal_a_batched_forward():
    rec = LMRecipe(arch="qwen3_5", vocab_size=96, hidden=32, layers=4, heads=2, kv_heads=1, head_dim=16,
                   intermediate=48, lin_heads=2, lin_head_dim=16, seq_len=16, batch=1, steps=1, lr=1e-3,
                   max_seconds=1)
    torch.manual_seed(0)
    model = build_model(rec.hf_config(eos_id=0, max_position_embeddings=256)).eval()
    ft = FeatureTarget(model, [1, 3])
    prefixes = stream_prefixes(np.arange(200, dtype=np.int32) % 90 + 3, n=3, prefix_len=7, seed=1)
    seqs, feats, stopped = greedy_continuations(ft, prefixes, gen_len=9, batch=2, device="cpu")
    assert not stopped and seqs.shape == (3, 16) and feats.shape == (3, 15, 64)
    assert torch.equal(seqs[:, :7], torch.from_numpy(prefixes))
    # Every continuation token is the argmax after the tokens before it.
    with torch.no_grad():
        logits = model(input_ids=seqs).logits
    assert torch.equal(logits[:, 6:-1].argmax(-1), seqs[:, 7:])
    ft.forward_batch(seqs)
    torch.testing.assert_close(feats.float(), ft.features()[:, :-1].bfloat16().float(), rtol=0.02, atol=0.02)
    # The time guard keeps what was finished.
    seqs0, feats0, stopped0 = greedy_continuations(ft, prefixes, gen_len=9, batch=2, device="cpu", max_seconds=-1)
    assert stopped0 and len(seqs0) == len(feats0) == 0


def test_block_batch_context_shorter_than_the_sequence():
    gen = torch.Generator().manual_seed(0)
    seqs = torch.arange(30).view(1, 30)
    bb = block_batch(seqs, prefix_len=10, block_size=4, anchors=3, mask_id=7, gen=gen, ctx_len=29)
    assert bb["mask"].shape == (1, 1, 12, 29 + 12)
