"""Buildkite's official pipeline JSON schema, applied one step type at a time.

The schema ships inside the ``buildkite-sdk`` package (``buildkite_sdk/schema.json``). Steps sit
under an ``anyOf``, so validating a whole pipeline only says "not valid under any of the given
schemas"; validating each step against its own definition names the bad property.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attngroup.ci.errors import CIInputError

if TYPE_CHECKING:  # imported when a pipeline is validated, not by select or check-deps
    import jsonschema

# Which schema definition a step object is checked against, by its distinguishing key.
STEP_TYPES = (
    ("group", "groupStep"),
    ("block", "blockStep"),
    ("input", "inputStep"),
    ("wait", "waitStep"),
    ("trigger", "triggerStep"),
    ("command", "commandStep"),
    ("commands", "commandStep"),
)


@functools.cache
def load_schema() -> dict[str, Any]:
    """The schema file inside the installed ``buildkite_sdk`` package (not imported: it is
    only data to us, and importing the SDK pulls in pydantic)."""
    spec = importlib.util.find_spec("buildkite_sdk")
    if spec is None or not spec.submodule_search_locations:
        raise CIInputError(
            "Buildkite's pipeline schema comes from the buildkite-sdk package: "
            "pip install buildkite-sdk"
        )
    schema_path = Path(spec.submodule_search_locations[0]) / "schema.json"
    return json.loads(schema_path.read_text(encoding="utf-8"))


@functools.cache
def _validator(definition: str) -> jsonschema.Draft7Validator:
    import jsonschema

    schema = load_schema()
    return jsonschema.Draft7Validator(
        {"$ref": f"#/definitions/{definition}", "definitions": schema["definitions"]}
    )


def step_definition(step: Any) -> str | None:
    if step == "wait":
        return "stringWaitStep"
    if isinstance(step, Mapping):
        return next((definition for key, definition in STEP_TYPES if key in step), None)
    return None


def _step_errors(step: Any, where: str) -> list[str]:
    definition = step_definition(step)
    if definition is None:
        return [f"{where}: not a recognisable Buildkite step: {step!r}"]
    errors = [
        f"{where} ({definition}): {error.message}"
        + (f" at {'/'.join(map(str, error.absolute_path))}" if error.absolute_path else "")
        for error in sorted(_validator(definition).iter_errors(step), key=str)
    ]
    if definition == "groupStep" and isinstance(step.get("steps"), list):
        for index, child in enumerate(step["steps"]):
            name = child.get("key", index) if isinstance(child, Mapping) else index
            errors.extend(_step_errors(child, f"{where}.steps[{name}]"))
    return errors


def validate_pipeline(pipeline: Mapping[str, Any]) -> list[str]:
    """Every schema violation of ``pipeline``, one precise message per problem."""
    import jsonschema

    top = jsonschema.Draft7Validator(load_schema())
    errors = [f"pipeline: {error.message}" for error in top.iter_errors({**pipeline, "steps": []})]
    for index, step in enumerate(pipeline.get("steps", [])):
        name = step.get("key", step.get("group", index)) if isinstance(step, Mapping) else index
        errors.extend(_step_errors(step, f"steps[{name}]"))
    return errors
