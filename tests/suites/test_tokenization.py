"""Tokenizer loading and chat templates rendered like transformers' apply_chat_template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lucebench.errors import UserError
from lucebench.suites.tokenization import load_tokenizer

QWEN_LIKE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}{%- if message.role == 'user' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


@pytest.mark.parametrize("template", ["chatml", "qwen-like"])
@pytest.mark.parametrize("thinking", [True, False])
def test_chat_template_matches_transformers(model_dir: Path, tmp_path: Path, template: str, thinking: bool) -> None:
    transformers = pytest.importorskip("transformers")  # the [hf] extra; our renderer must not need it
    folder = model_dir
    if template == "qwen-like":
        folder = tmp_path / "qwen"
        folder.mkdir()
        for name in ("tokenizer.json", "generation_config.json"):
            (folder / name).write_bytes((model_dir / name).read_bytes())
        cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
        cfg["chat_template"] = QWEN_LIKE
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Question: 2+2?\nAnswer: "}]
    ours = load_tokenizer(folder).apply_chat_template(messages, enable_thinking=thinking)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    theirs = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    assert ours == theirs
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, enable_thinking=thinking)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert load_tokenizer(folder).encode(ours, add_special_tokens=False) == list(ids)


def test_chat_template_jinja_file_wins_and_eos_ids(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (folder / name).write_bytes((model_dir / name).read_bytes())
    (folder / "chat_template.jinja").write_text("{{ bos_token or '' }}[{{ messages[0]['content'] }}]{{ strftime_now('%Y') }}")
    tok = load_tokenizer(folder)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[hi]2024"  # fixed date: reproducible
    eos = tok.tokenizer.token_to_id("<|endoftext|>"), tok.tokenizer.token_to_id("<|im_end|>")
    assert tok.eos_ids == list(eos)


def test_template_errors_are_user_errors(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ raise_exception('no system') }}"}))
    with pytest.raises(UserError, match="no system"):
        load_tokenizer(folder).apply_chat_template([{"role": "user", "content": "x"}])
    (folder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(UserError, match="no chat template"):
        load_tokenizer(folder).apply_chat_template([{"role": "user", "content": "x"}])
    (folder / "tokenizer.json").write_text("{broken")
    with pytest.raises(UserError, match="cannot load the tokenizer"):
        load_tokenizer(folder)
