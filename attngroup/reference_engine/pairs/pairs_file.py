"""The pairs file: extra model pairs from checkpoint configs, in YAML.

```yaml
pairs:
  - name: my-gemma4-e2b-mtp          # a new name (not a registered pair)
    target: configs/gemma4-e2b/config.json    # relative to this file
    draft: configs/gemma4-e2b-assistant/config.json
    method: mtp                       # mtp | eagle | draft_model
    draft_kv: shared:last-of-type     # optional: own | shared:last-of-type (default: the draft's kind)
    description: optional text
    backend: triton                   # optional default backend
```

``load_pairs_file`` checks everything before returning (unknown keys, missing
paths, unknown methods, configs transformers cannot read, duplicate names, optional
fields present but empty)
and raises ``PairsFileError`` naming the file, the entry and the field.
``register_pairs_file`` adds the pairs to ``MODEL_PAIRS`` so every suite, the
``inspect`` and the ``generate`` commands see them. ``AGC_PAIRS`` names a file
for runs that cannot pass ``--pairs`` (CI).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from attngroup.reference_engine.model_pairs import BUILTIN_PAIR_NAMES, ModelPair, register_pairs
from attngroup.reference_engine.pairs.pair_configs import PairConfigError, pair_from_configs

REQUIRED_KEYS = ("name", "target", "draft", "method")
OPTIONAL_KEYS = ("draft_kv", "description", "backend")


class PairsFileError(PairConfigError):
    """A pairs file that cannot be used as written."""


def load_pairs_file(path: Path) -> list[ModelPair]:
    path = Path(path)
    if not path.is_file():
        raise PairsFileError(f"{path}: no such pairs file")
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise PairsFileError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("pairs"), list):
        raise PairsFileError(f"{path}: pairs: expected a top-level 'pairs:' list")
    pairs: list[ModelPair] = []
    for index, entry in enumerate(document["pairs"]):
        pairs.append(_pair_of(path, index, entry, {pair.name for pair in pairs}))
    return pairs


def _pair_of(path: Path, index: int, entry: object, seen: set[str]) -> ModelPair:
    where = f"{path}: pairs[{index}]"
    if not isinstance(entry, dict):
        raise PairsFileError(f"{where}: expected a mapping with {', '.join(REQUIRED_KEYS)}")
    for key in REQUIRED_KEYS:
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise PairsFileError(f"{where}.{key}: missing (a string is required)")
    for key in OPTIONAL_KEYS:  # present means meant: an empty value is not "the default"
        if key in entry and (not isinstance(entry[key], str) or not entry[key].strip()):
            raise PairsFileError(f"{where}.{key}: empty (give a value or leave the field out)")
    unknown = sorted(set(entry) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise PairsFileError(
            f"{where}.{unknown[0]}: unknown field (known: {REQUIRED_KEYS + OPTIONAL_KEYS})"
        )
    name = entry["name"]
    if name in seen or name in BUILTIN_PAIR_NAMES:
        raise PairsFileError(f"{where}.name: {name!r} is already defined")
    paths = {key: (path.parent / entry[key]).resolve() for key in ("target", "draft")}
    for key, config_path in paths.items():
        if not config_path.exists():
            raise PairsFileError(f"{where}.{key}: {config_path} does not exist")
    try:
        return pair_from_configs(
            name,
            paths["target"],
            paths["draft"],
            entry["method"],
            draft_kv=entry.get("draft_kv"),
            description=entry.get("description"),
            backend=entry.get("backend", "triton"),
        )
    except PairConfigError as error:
        raise PairsFileError(f"{where}: {error}") from None


_REGISTERED: dict[Path, list[ModelPair]] = {}


def register_pairs_file(path: Path) -> list[ModelPair]:
    """Load ``path`` and add its pairs to ``MODEL_PAIRS`` (once per process and file;
    a name another file already registered is an error)."""
    key = Path(path).resolve()
    if key not in _REGISTERED:
        pairs = load_pairs_file(path)
        try:
            register_pairs(pairs)
        except ValueError as error:
            raise PairsFileError(f"{path}: {error}") from None
        _REGISTERED[key] = pairs
    return _REGISTERED[key]
