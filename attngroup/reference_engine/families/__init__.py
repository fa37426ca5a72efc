"""The model-family registry: every family the engine runs, found by name or model type.

Callers ask a family object (``family_named(pair.family)``, ``family_for(config.model_type)``)
what differs between families; no other module compares family names. A family's
questions are answered in its own module here (layers, support checks, scaling, quirks)
and its engine model in ``attngroup.reference_engine.models``.
"""

from __future__ import annotations

from attngroup.reference_engine.families.dense import DENSE
from attngroup.reference_engine.families.family import ModelFamily, UnknownFamilyError
from attngroup.reference_engine.families.gemma4 import GEMMA4
from attngroup.reference_engine.families.qwen3_next import QWEN3_NEXT

FAMILIES: tuple[ModelFamily, ...] = (*DENSE, QWEN3_NEXT, GEMMA4)
_BY_NAME = {family.name: family for family in FAMILIES}
_BY_TARGET_TYPE = {model_type: family for family in FAMILIES for model_type in family.target_types}
#: config model types a target may have
TARGET_TYPES = tuple(sorted(_BY_TARGET_TYPE))


def family_named(name: str) -> ModelFamily:
    """The family a ``ModelPair.family`` names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownFamilyError(
            f"no model family {name!r} (known: {', '.join(_BY_NAME)})"
        ) from None


def family_for(model_type: str) -> ModelFamily:
    """The family of a config's ``model_type`` (a target's, or a text model's inside one)."""
    try:
        return _BY_TARGET_TYPE[model_type]
    except KeyError:
        raise UnknownFamilyError(
            f"{model_type!r} has no engine model (supported: {list(TARGET_TYPES)})"
        ) from None
