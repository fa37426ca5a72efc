"""A pair's layer describer by family name (the suites look describers up here).

Each family's describer, which turns (target config, draft config, TP size, backend)
into the per-rank ``LayerDescription``s of ``ModelPair.layers()``, lives in its module
of ``attngroup.reference_engine.families``.
"""

from __future__ import annotations

from attngroup.reference_engine.families import family_named
from attngroup.reference_engine.families.family import LayerDescriber


def layer_describer(family: str) -> LayerDescriber:
    """The function that turns a family's (target, draft) configs into layer descriptions."""
    return family_named(family).describe_layers
