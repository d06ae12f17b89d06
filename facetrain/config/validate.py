"""The field checks of a config tree, and the one line that reports the first broken rule.

A section declares its values' checks (`setting(default, *checks)`, see `facetrain/config/checks.py`);
`field_problems` applies them, and the code that owns a section, or combines several, adds its rules
as more `Problem`s. `raise_first` turns the first into one `FacetrainError` line that names the key,
where it was given, the bad value and what is allowed, so a user fixes it without reading a traceback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from facetrain.config.checks import field_checks
from facetrain.config.loader import where_given
from facetrain.errors import FacetrainError

# A broken rule: (key, value, what the value must be).
Problem = tuple[str, Any, str]


def raise_first(
    problems: Iterable[Problem], source: str = "", given: Mapping[str, str] | None = None
) -> None:
    """Raise one FacetrainError for the first problem, naming where its key was given (`where_given`:
    the option in `given`, else the config file `source`); nothing when there is none."""
    for key, value, allowed in problems:  # the first one only
        raise FacetrainError(f"{where_given(key, source, given)}: {key} = {show(value)}: {allowed}")


def validate_section(section: Any, prefix: str) -> None:
    """The field checks of one section, for library code that receives a section without a whole config."""
    for key, value, allowed in field_problems(section, prefix):  # the first one only
        raise FacetrainError(f"{key} = {show(value)}: {allowed}")


def field_problems(section: Any, prefix: str = "") -> Iterator[Problem]:
    """Every value that breaks a check its field declares, in field order, sections recursively."""
    for field in dataclasses.fields(section):
        value = getattr(section, field.name)
        key = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            yield from field_problems(value, key + ".")
            continue
        if value is None:
            continue  # only optional fields may be None; the loader enforces the types
        for check in field_checks(field):
            allowed = check.problem(value)
            if allowed is not None:
                yield key, value, allowed
                break


def show(value: Any, limit: int = 200) -> str:
    """A value as a message shows it, cut at `limit` characters (a 3000-digit train.steps was echoed whole)."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}..."
