"""YAML parsing that remembers line numbers and rejects duplicate mapping keys.

PyYAML silently keeps the last of two equal keys and forgets positions; a strict loader needs
both, so every mapping becomes a ``LocatedDict`` that knows the line of each of its keys, and
every sequence a ``LocatedList`` that knows the line of each item (a dead dependency entry is
reported at its own line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from attngroup.ci.errors import CIInputError, Location


class LocatedDict(dict):
    """A YAML mapping with the 1-based line of the mapping itself and of each key."""

    line: int
    key_lines: dict[Any, int]


class LocatedList(list):
    """A YAML sequence with the 1-based line of each item."""

    item_lines: list[int]


# libyaml's parser when PyYAML was built with it (about 5x faster on vLLM's 0.5 MB of YAML).
try:
    from yaml import CSafeLoader as _BaseLoader
except ImportError:
    from yaml import SafeLoader as _BaseLoader


class _LocatingLoader(_BaseLoader):
    pass


def _construct_mapping(loader: _LocatingLoader, node: yaml.MappingNode) -> LocatedDict:
    loader.flatten_mapping(node)
    mapping = LocatedDict()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in mapping.key_lines:
            raise CIInputError(
                f"duplicate key {key!r} (first defined on line {mapping.key_lines[key]})",
                Location(loader.name, line),
            )
        mapping.key_lines[key] = line
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


def _construct_sequence(loader: _LocatingLoader, node: yaml.SequenceNode) -> LocatedList:
    sequence = LocatedList(loader.construct_object(item, deep=True) for item in node.value)
    sequence.item_lines = [item.start_mark.line + 1 for item in node.value]
    return sequence


_LocatingLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LocatingLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence
)


def load_yaml(path: Path, display_path: str | None = None) -> Any:
    """Parse one YAML file; syntax errors and duplicate keys become ``CIInputError``."""
    name = display_path or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise CIInputError(f"cannot read file: {error.strerror}", Location(name)) from None
    loader = _LocatingLoader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark else 0
        raise CIInputError(f"invalid YAML: {error.problem}", Location(name, line)) from None
    except yaml.YAMLError as error:
        raise CIInputError(f"invalid YAML: {error}", Location(name)) from None
    finally:
        loader.dispose()


def line_of(mapping: Any, key: Any) -> int:
    """Line of ``key`` in ``mapping`` if it was loaded from YAML, else 0."""
    if isinstance(mapping, LocatedDict):
        return mapping.key_lines.get(key, mapping.line)
    return 0


def item_lines(sequence: Any) -> dict[Any, int]:
    """Item -> line of its first occurrence, for a sequence loaded from YAML (else empty)."""
    if not isinstance(sequence, LocatedList):
        return {}
    lines: dict[Any, int] = {}
    for item, line in zip(sequence, sequence.item_lines, strict=True):
        if isinstance(item, str):
            lines.setdefault(item, line)
    return lines


def to_plain(value: Any) -> Any:
    """``value`` with every ``LocatedDict`` turned into a plain dict (for dumping)."""
    if isinstance(value, dict):
        return {key: to_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_plain(item) for item in value]
    return value
