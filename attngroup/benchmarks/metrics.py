"""The benchmarks' result format: a JSON list of metrics with their raw samples.

Every benchmark writes the same list (``attngroup.benchmarks.table`` tabulates it,
``attngroup.benchmarks.run_record`` turns it into a reports run record), atomically, so a
run that is cut short or fails never leaves a half-written file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from attngroup.reports.atomic import write_text_atomic


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    unit: str
    samples: list[float]
    higher_is_better: bool

    def as_json(self) -> dict:
        return asdict(self)


def write_metrics(path: Path, metrics: Sequence[Metric]) -> None:
    write_text_atomic(path, json.dumps([metric.as_json() for metric in metrics], indent=1))
