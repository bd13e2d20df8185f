"""The one error type that bad input raises anywhere in trainsim.

The CLI turns a :class:`SpecError` into a single line on stderr and exit code 2,
so every message must name the offending field and the rule it broke.
"""

from __future__ import annotations

__all__ = ["SpecError", "NoFeasiblePlan", "field_name"]


def field_name(key: object) -> str:
    """A user-supplied key as it should appear in a one-line message."""
    text = str(key)
    return text if text.replace("-", "_").isidentifier() else repr(text)


class SpecError(ValueError):
    """Invalid user input: ``field`` names what is wrong, ``rule`` says why."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class NoFeasiblePlan(RuntimeError):
    """No plan satisfies the constraints (CLI exit code 3)."""
