"""YAML loading that remembers where every key came from, so errors can name the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lucebench.errors import UserError

LinePath = tuple[str | int, ...]


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _line_map(node: yaml.Node, path: LinePath, out: dict[LinePath, int]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[path + (key,)] = key_node.start_mark.line + 1
            _line_map(value_node, path + (key,), out)
            out[path + (key,)] = key_node.start_mark.line + 1  # the key's line wins over its value's
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, path + (i,), out)


def load_yaml(path: Path) -> tuple[Any, dict[LinePath, int]]:
    """Parse a YAML file; returns the data and a map from key path to 1-based line number.

    Raises UserError naming the file and line for unreadable files and syntax errors.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError("config file not found", where=str(path), hint="give the path of a YAML config, e.g. configs/cpu-smoke.yaml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read config: {exc}", where=str(path)) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"malformed YAML: {problem}", where=where) from None
    lines: dict[LinePath, int] = {}
    if node is not None:
        _line_map(node, (), lines)
    return data, lines


def line_of(lines: dict[LinePath, int], loc: LinePath) -> int | None:
    """The line of the deepest known prefix of `loc` (a pydantic error location)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())
