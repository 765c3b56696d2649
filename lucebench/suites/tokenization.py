"""The target model's tokenizer and chat template, read from its folder (tokenizer.json, tokenizer_config.json).

Token ids from `tokenizers.Tokenizer` are what every engine receives. Chat templates are rendered with
jinja2 the way transformers' `apply_chat_template` does (sandboxed environment, trim_blocks,
lstrip_blocks, loopcontrols, `tojson`, `raise_exception`, `{% generation %}` blocks), so the text matches
transformers for the same messages and flags. One deliberate difference: `strftime_now` returns a fixed
date, because a prompt that changes with the calendar is not a reproducible workload.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from lucebench.errors import UserError
from lucebench.suites.datasource import sha256_file

FIXED_DATE = _dt.datetime(2024, 7, 26)  # the date templates see through strftime_now (see module doc)


@dataclass
class ModelTokenizer:
    """A model folder's tokenizer, special tokens and chat template."""

    path: Path
    tokenizer: Tokenizer
    config: dict[str, Any] = field(default_factory=dict)  # tokenizer_config.json
    chat_template: str | None = None
    eos_ids: list[int] = field(default_factory=list)
    sha256: str = ""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (the tokenizer's post-processor adds BOS etc. when asked)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of several texts at once (parallel in the Rust tokenizer)."""
        return [list(e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens kept."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def special_tokens(self) -> dict[str, str]:
        """`bos_token`, `eos_token`, ... as strings, the variables chat templates expect."""
        out = {}
        for key, value in self.config.items():
            if key.endswith("_token"):
                if isinstance(value, dict):
                    value = value.get("content")
                if isinstance(value, str):
                    out[key] = value
        return out

    def apply_chat_template(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True,
                            enable_thinking: bool | None = None) -> str:
        """The chat template rendered for `messages`, like transformers' apply_chat_template(tokenize=False)."""
        if not self.chat_template:
            raise UserError("the model has no chat template", where=str(self.path / "tokenizer_config.json"),
                            hint="use prompt format raw, or give a model whose tokenizer_config.json has chat_template")
        kwargs: dict[str, Any] = dict(self.special_tokens())
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        try:
            return _compile(self.chat_template).render(messages=messages, tools=None, documents=None,
                                                       add_generation_prompt=add_generation_prompt, **kwargs)
        except jinja2.TemplateError as exc:
            raise UserError(f"the chat template failed: {exc}", where=str(self.path / "tokenizer_config.json")) from None


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers in transformers): render the body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # transformers' tojson: no HTML escaping (jinja's default filter escapes <, >, &).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: FIXED_DATE.strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"the chat template does not parse: {exc.message} (template line {exc.lineno})") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read JSON: {exc}", where=str(path)) from None
    if not isinstance(data, dict):
        raise UserError("expected a JSON object", where=str(path))
    return data


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    # transformers >= 4.43 saves the template as chat_template.jinja; older files keep it in the config.
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None and (folder / "chat_template.json").is_file():
        template = _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _eos_ids(folder: Path, tok: Tokenizer, config: dict[str, Any]) -> list[int]:
    ids: list[int] = []
    if (folder / "generation_config.json").is_file():
        eos = _read_json(folder / "generation_config.json").get("eos_token_id")
        ids.extend([eos] if isinstance(eos, int) else [i for i in (eos or []) if isinstance(i, int)])
    eos_tok = config.get("eos_token")
    if isinstance(eos_tok, dict):
        eos_tok = eos_tok.get("content")
    if isinstance(eos_tok, str) and tok.token_to_id(eos_tok) is not None:
        ids.append(tok.token_to_id(eos_tok))
    return list(dict.fromkeys(ids))


@functools.lru_cache(maxsize=8)
def _load_cached(folder: Path, stamp: tuple[int, ...]) -> ModelTokenizer:  # stamp: file mtimes, so edits reload
    path = folder / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the Rust library raises plain Exception for bad files
        raise UserError(f"cannot load the tokenizer: {exc}", where=str(path)) from None
    config = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    return ModelTokenizer(path=folder, tokenizer=tok, config=config, chat_template=_chat_template(folder, config),
                          eos_ids=_eos_ids(folder, tok, config), sha256=sha256_file(path))


def load_tokenizer(model_dir: Path) -> ModelTokenizer:
    """The tokenizer of a model folder (Hugging Face layout: tokenizer.json [+ tokenizer_config.json])."""
    folder = Path(model_dir).expanduser().resolve()
    if not (folder / "tokenizer.json").is_file():
        raise UserError("no tokenizer.json in the model folder", where=str(folder),
                        hint="give a Hugging Face model folder (e.g. from `lucebench models synth` or `models fetch`)")
    stamp = tuple(p.stat().st_mtime_ns if p.is_file() else 0 for p in (
        folder / "tokenizer.json", folder / "tokenizer_config.json", folder / "chat_template.jinja",
        folder / "generation_config.json"))
    return _load_cached(folder, stamp)
