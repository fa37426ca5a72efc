"""``check-deps --fix``: add missing entries to ``source_file_dependencies`` in place.

The edit is textual: the YAML is parsed only to find where a step's list ends, and a line in
the style of the list's last item is inserted there. Every other byte (comments, key order,
quoting, vLLM's mixed indentation) stays as it was. Files are replaced atomically.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from attngroup.ci.areas.config import derive_step_key
from attngroup.ci.atomic_write import write_atomically
from attngroup.ci.errors import CIInputError, Location

_PLAIN = re.compile(r"[\w./-]+")


def _yaml_scalar(entry: str) -> str:
    return entry if _PLAIN.fullmatch(entry) else json.dumps(entry)


def _step_nodes(text: str, name: str) -> dict[str, yaml.MappingNode]:
    root = yaml.compose(text)
    steps = next((value for key, value in root.value if key.value == "steps"), None)
    if not isinstance(steps, yaml.SequenceNode):
        raise CIInputError("no 'steps' list to fix", Location(name))
    found = {}
    for node in steps.value:
        fields = {key.value: value for key, value in node.value}
        key = fields["key"].value if "key" in fields else derive_step_key(fields["label"].value)
        found[key] = node
    return found


def _insert_entry(text: str, step: yaml.MappingNode, entry: str, name: str) -> str:
    """``text`` with ``entry`` appended to the step's dependency list."""
    lines = text.splitlines(keepends=True)
    fields = {key.value: (key, value) for key, value in step.value}
    scalar = _yaml_scalar(entry)
    if "source_file_dependencies" not in fields:
        if step.flow_style:
            line = step.start_mark.line + 1
            raise CIInputError(
                "cannot add to a flow-style step; add the entry by hand", Location(name, line)
            )
        keys = [key for key, _ in step.value]
        # Before 'commands', unless it is the step's first key: its line starts with the list's
        # '- ', so the block would land in the previous step; then before the second key.
        anchor_key = fields["commands"][0] if "commands" in fields else keys[0]
        if anchor_key is keys[0]:
            anchor_key = keys[1]
        indent = " " * anchor_key.start_mark.column
        block = f"{indent}source_file_dependencies:\n{indent}  - {scalar}\n"
        lines.insert(anchor_key.start_mark.line, block)
        return "".join(lines)
    listing = fields["source_file_dependencies"][1]
    if not isinstance(listing, yaml.SequenceNode):
        line = listing.start_mark.line + 1
        raise CIInputError("source_file_dependencies is not a list", Location(name, line))
    if listing.flow_style:
        closing = listing.end_mark.index - 1
        separator = ", " if listing.value else ""
        return f"{text[:closing]}{separator}{scalar}{text[closing:]}"
    last = listing.value[-1]
    line = lines[last.start_mark.line]
    lines.insert(last.start_mark.line + 1, f"{line[: last.start_mark.column]}{scalar}\n")
    return "".join(lines)


def add_dependencies(yaml_path: Path, additions: Mapping[str, list[str]]) -> list[str]:
    """Append entries per step key; returns "key: entry" for every entry actually added."""
    text = yaml_path.read_text(encoding="utf-8")
    name = str(yaml_path)
    added = []
    for key, entries in additions.items():
        for entry in entries:
            steps = _step_nodes(text, name)
            if key not in steps:
                raise CIInputError(f"no step with key {key!r} to fix", Location(name))
            fields = {field.value: value for field, value in steps[key].value}
            declared = fields.get("source_file_dependencies")
            existing = [item.value for item in getattr(declared, "value", [])]
            if entry in existing:
                continue
            text = _insert_entry(text, steps[key], entry, name)
            added.append(f"{key}: {entry}")
    if added:
        write_atomically(yaml_path, text)
    return added
