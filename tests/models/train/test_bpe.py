"""The trained tokenizers: special ids first, the mask token reserved, transformers reads the files."""

from __future__ import annotations

import pytest

from lucebench.models.train.bpe import CHATML_SPECIALS, MASK_TOKEN, encode_documents, save_tokenizer, train_bpe

TEXTS = [f"def function_{i}(value):\n    return value + {i}  # adds {i}\n" for i in range(200)] + [
    "The quick brown fox jumps over the lazy dog. " * 20]


def test_specials_take_the_first_ids_and_the_vocab_size_is_exact(tmp_path):
    tok = train_bpe(TEXTS, vocab_size=300, specials=CHATML_SPECIALS + [MASK_TOKEN])
    assert tok.get_vocab_size() == 300
    assert [tok.token_to_id(t) for t in CHATML_SPECIALS + [MASK_TOKEN]] == list(range(6))
    ids = encode_documents(tok, ["def f():", "x"], eos_id=0)
    assert ids[-1] == 0 and list(ids).count(0) == 2
    assert tok.decode(tok.encode(TEXTS[3]).ids) == TEXTS[3]
    save_tokenizer(tok, tmp_path, model_max_length=1024)
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.eos_token == "<|endoftext|>" and hf.convert_tokens_to_ids(MASK_TOKEN) == 5
    assert hf.encode(TEXTS[0]) == tok.encode(TEXTS[0]).ids


def test_too_small_a_corpus_is_an_error():
    with pytest.raises(RuntimeError, match="corpus too small"):
        train_bpe(["ab"], vocab_size=5000, specials=CHATML_SPECIALS)
