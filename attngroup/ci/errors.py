"""One error type for every bad input the harness meets, so the CLI maps all of them to exit 2."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """Where in which file a problem sits (line is 1-based; 0 when unknown)."""

    path: str
    line: int = 0

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line else self.path


class CIInputError(Exception):
    """Bad configuration, arguments or repository state; the message says what and where."""

    def __init__(self, message: str, location: Location | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class CIInputErrors(CIInputError):
    """Several independent problems found in one pass (all are reported, not just the first)."""

    def __init__(self, errors: list[CIInputError]) -> None:
        super().__init__("\n".join(str(error) for error in errors))
        self.errors = errors
