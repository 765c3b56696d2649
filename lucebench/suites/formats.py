"""Turning a row into prompt text and token ids: `raw` templates or the model's chat template."""

from __future__ import annotations

import re
from typing import Any

from lucebench.errors import UserError
from lucebench.suites.spec import PromptFormat
from lucebench.suites.tokenization import ModelTokenizer

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def render_template(template: str, values: dict[str, Any], *, where: str = "suite") -> str:
    """Fill `{role}` placeholders; `{{`/`}}` are literal braces; other braces (e.g. `\\boxed{}`) stay as they are.

    Unlike str.format, LaTeX such as `\\boxed{}` needs no escaping; an unknown `{name}` is an error, not a silent blank.
    """
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "{{":
            return "{"
        if m.group(0) == "}}":
            return "}"
        name = m.group(1)
        if name not in values:
            raise UserError(f"template placeholder {{{name}}} is not a field", where=where,
                            hint=f"fields: {', '.join(sorted(values))}; write {{{{ and }}}} for literal braces")
        return str(values[name])
    return _PLACEHOLDER.sub(sub, template)


def format_name(fmt: PromptFormat) -> str:
    """The recorded format name: raw, chat (thinking off) or chat-thinking."""
    if fmt.format == "raw":
        return "raw"
    return "chat-thinking" if fmt.thinking else "chat"


def parse_format_override(value: str, base: PromptFormat) -> PromptFormat:
    """`raw`, `chat`, `chat-thinking` or `chat-nothinking` applied over the suite's prompt section."""
    choices = {"raw": ("raw", base.thinking), "chat": ("chat", False), "chat-nothinking": ("chat", False),
               "chat-thinking": ("chat", True)}
    if value not in choices:
        raise UserError(f"unknown prompt format {value!r}", hint=f"use one of: {', '.join(choices)}")
    fmt, thinking = choices[value]
    return base.model_copy(update={"format": fmt, "thinking": thinking})


def build_prompt(content: str, fmt: PromptFormat, tok: ModelTokenizer) -> tuple[str, list[int]]:
    """Final prompt text and ids for one filled template.

    raw: the text as is, encoded with the tokenizer's special tokens (a BOS where the model has one, like
    `tokenizer(text)`). chat: the user message in the chat template with the generation prompt; the template
    writes its own special tokens, so none are added (like apply_chat_template(tokenize=True)).
    """
    if fmt.format == "raw":
        return content, tok.encode(content, add_special_tokens=True)
    text = chat_text(content, fmt, tok)
    return text, tok.encode(text, add_special_tokens=False)


def chat_text(content: str, fmt: PromptFormat, tok: ModelTokenizer) -> str:
    """The chat-template rendering of one user message (plus the optional system message)."""
    messages = ([{"role": "system", "content": fmt.system}] if fmt.system else []) + [
        {"role": "user", "content": content}]
    return tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=fmt.thinking)
