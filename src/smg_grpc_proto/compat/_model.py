"""The vocabulary shared by every part of the checker: levels, findings and the input error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["wire", "wire-json", "package", "file"]
"""How strict the check is: buf's category of the same name (``wire`` is ``WIRE``, ``wire-json``
``WIRE_JSON``, ``package`` ``PACKAGE``, ``file`` ``FILE``). A stricter level catches everything a
looser one does, sometimes through a stricter rule (``FIELD_NO_DELETE`` at ``package`` where
``wire`` has ``FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED``)."""

LEVELS: tuple[Level, ...] = ("wire", "wire-json", "package", "file")
"""Every level, loosest first."""

BUF_CATEGORY: dict[Level, str] = {
    "wire": "WIRE",
    "wire-json": "WIRE_JSON",
    "package": "PACKAGE",
    "file": "FILE",
}
"""The buf category id of each level."""


@dataclass(frozen=True)
class Finding:
    """One breaking change, located in the current schema."""

    rule: str
    """buf rule id, e.g. ``FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED``."""
    file: str
    """Descriptor file name in the current schema (the reference's file name for deletions)."""
    line: int | None
    """1-based line in ``file`` when source info is available."""
    column: int | None
    """1-based column in ``file`` when source info is available."""
    message: str
    """A sentence naming the element and the old and new values."""

    def sort_key(self) -> tuple[str, int, int, str, str]:
        """Order used for every list of findings: file, line, column, rule, message."""
        return (self.file, self.line or 0, self.column or 0, self.rule, self.message)


class CompatError(Exception):
    """An input could not be read or is not a valid schema (the CLI exits with code 2)."""
