"""Number formatting shared by the HTML report and the text summary."""

from __future__ import annotations

import math


def format_number(value: float) -> str:
    return f"{value:.4g}"


def format_value(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{format_number(value)} {unit}".strip()


def format_change(change: float | None) -> str:
    if change is None or math.isnan(change):
        return "—"
    return f"{change * 100:+.1f} %"


def format_p_value(p_value: float | None) -> str:
    if p_value is None:
        return "—"
    return f"{p_value:.2g}" if p_value >= 1e-4 else "<1e-4"


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"
