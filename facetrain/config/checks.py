"""Declarative value checks that a config section attaches to its fields.

Each check answers `problem(value)` with what the value must be (a phrase that completes
"KEY = VALUE: ...") or None when the value is fine. A section declares them next to each field with
`setting(default, *checks)`, so the allowed values of a key are written once, where the key is, and
`facetrain.config.validate` applies them all in one pass.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Iterable
from typing import Any, Protocol

CHECKS = "checks"
IS_PATH = "is_path"
FORMERLY = "formerly"


class Check(Protocol):
    def problem(self, value: Any) -> str | None: ...


def setting(default: Any, *checks: Check, path: bool = False, formerly: str | None = None) -> Any:
    """A dataclass field with its checks; `path` marks a path whose `~` the loader expands, and which
    the file system must be able to name (`PathName`); `formerly` is the whole dotted key the setting
    had before it moved to this section, which the loader still reads (`facetrain.config.former_keys`).

    A list or dict default is copied for every instance, as dataclasses require of mutable defaults.
    """
    metadata = {CHECKS: (*checks, PathName()) if path else checks, IS_PATH: path, FORMERLY: formerly}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_checks(field: dataclasses.Field) -> tuple[Check, ...]:
    return field.metadata.get(CHECKS, ())


def is_path_field(field: dataclasses.Field) -> bool:
    return bool(field.metadata.get(IS_PATH, False))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else str(value)


def _finite(value: Any) -> bool:
    """A number that is not NaN or infinite; an int always is (math.isfinite of one past float's
    range raised OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


# The largest float32: settings become float32 tensors and optimizer arguments, where 1e308 overflows
FLOAT32_MAX = 3.4028234663852886e38


def _fits_float32(value: Any) -> bool:
    return not isinstance(value, float) or abs(value) <= FLOAT32_MAX


@dataclasses.dataclass(frozen=True)
class Within:
    """A finite number between bounds; `brackets` says which ends are included, as in "[0, 1)"."""

    low: float | None = None
    high: float | None = None
    brackets: str = "[]"

    def describe(self) -> str:
        if self.high is None:
            return f"{'>=' if self.brackets[0] == '[' else '>'} {_number(self.low)}"
        if self.low is None:
            return f"{'<=' if self.brackets[1] == ']' else '<'} {_number(self.high)}"
        return f"in {self.brackets[0]}{_number(self.low)}, {_number(self.high)}{self.brackets[1]}"

    def accepts(self, value: Any) -> bool:
        if not (_finite(value) and _fits_float32(value)):
            return False
        if self.low is not None and not (value >= self.low if self.brackets[0] == "[" else value > self.low):
            return False
        return self.high is None or (value <= self.high if self.brackets[1] == "]" else value < self.high)

    def problem(self, value: Any) -> str | None:
        if self.accepts(value):
            return None
        if _finite(value) and not _fits_float32(value) and self.high is None:
            return f"must be {self.describe()}, and within float32's range (at most {FLOAT32_MAX:.3g})"
        return f"must be {'' if _finite(value) else 'a finite number '}{self.describe()}"


def at_least(low: float) -> Within:
    return Within(low=low, brackets="[]")


def above(low: float) -> Within:
    return Within(low=low, brackets="(]")


@dataclasses.dataclass(frozen=True)
class OneOf:
    """One of a fixed list of words (for choices that no registry holds)."""

    choices: tuple[str, ...]

    def problem(self, value: Any) -> str | None:
        return None if value in self.choices else f"must be one of: {', '.join(self.choices)}"


def registered_names(registry: Any) -> list[str]:
    """The names of a registry (a `facetrain.registry.Registry` or any collection of names), sorted."""
    return sorted(registry)


@dataclasses.dataclass(frozen=True)
class Registered:
    """A name in `registry`: a `facetrain.registry.Registry` (or any collection of names) that the
    section's own package holds, so a section is checked against what its code can build."""

    registry: Any

    def names(self) -> list[str]:
        return registered_names(self.registry)

    def problem(self, value: Any) -> str | None:
        """A registry answers for itself, so prefixed names (`timm:<name>`) pass or fail as it says."""
        if hasattr(self.registry, "problem"):
            return self.registry.problem(value)
        names = self.names()
        return None if value in names else f"must be one of: {', '.join(names)}"


@dataclasses.dataclass(frozen=True)
class RegisteredEach:
    """A list of names in a registry, none twice (e.g. train.trackers); an empty list chooses none."""

    registry: Any

    def problem(self, value: Any) -> str | None:
        names = registered_names(self.registry)
        wrong = next((item for item in value if item not in names), None)
        if wrong is not None:
            return f"{wrong!r} must be one of: {', '.join(names)}"
        return None if len(set(value)) == len(value) else "must not name one twice"


@dataclasses.dataclass(frozen=True)
class RegisteredSuffix:
    """A file name, or a list of them, whose extension (any case) is a name in a registry, e.g. the
    pairs formats."""

    registry: Any

    def names(self) -> list[str]:
        return registered_names(self.registry)

    def problem(self, value: Any) -> str | None:
        """A list (of such files) is checked item by item, and the message names the item at fault."""
        names = self.names()
        if isinstance(value, str):
            return None if self._suffix(value) in names else f"must be a file ending in {', '.join(names)}"
        if not value:
            return "must name at least one file, or be null"
        wrong = next((item for item in value if self._suffix(item) not in names), None)
        return None if wrong is None else f"{wrong!r} must be a file ending in {', '.join(names)}"

    @staticmethod
    def _suffix(value: str) -> str:
        return "." + value.rsplit(".", 1)[-1].lower() if "." in value else ""


@dataclasses.dataclass(frozen=True)
class NotEmpty:
    def problem(self, value: Any) -> str | None:
        return None if len(value) else "must not be empty"


@dataclasses.dataclass(frozen=True)
class PathName:
    """A path the file system can look up: no NUL byte, and no part longer than a file name may be
    (255 bytes on Linux, macOS and Windows' NTFS), which os.stat would raise on, not merely miss.
    A list of paths (`eval.pairs`) is checked path by path."""

    longest: int = 255

    def problem(self, value: Any) -> str | None:
        if isinstance(value, list):
            return next(filter(None, (self.problem(path) for path in value)), None)
        if "\0" in value:
            return "must not contain a NUL character"
        too_long = next((part for part in value.split("/") if len(os.fsencode(part)) > self.longest), None)
        if too_long is None:
            return None
        return f"a path part of {len(os.fsencode(too_long))} bytes is longer than a file name may be ({self.longest})"


@dataclasses.dataclass(frozen=True)
class Items:
    """A list with one entry per name in `names`, each passing `each`; `ordered`: non-decreasing."""

    names: tuple[str, ...]
    each: Within
    ordered: bool = False

    def problem(self, value: Any) -> str | None:
        fits = len(value) == len(self.names) and all(self.each.accepts(item) for item in value)
        if fits and (not self.ordered or list(value) == sorted(value)):
            return None
        order = f" with {' <= '.join(self.names)}" if self.ordered else ""
        return f"must be [{', '.join(self.names)}]{order}, each {self.each.describe()}"


@dataclasses.dataclass(frozen=True)
class EachNotEmpty:
    """A list of non-empty strings (e.g. module names)."""

    def problem(self, value: Iterable[str]) -> str | None:
        return None if all(item for item in value) else "must not contain empty names"
