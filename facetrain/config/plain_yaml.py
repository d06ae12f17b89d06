"""The YAML facetrain reads (configs, `--set` values, a checkpoint's config.yaml), parsed so that a
hostile or broken file costs a one-line error and not minutes and gigabytes.

`yaml.safe_load` refuses language tags but expands aliases: 366 bytes of anchors each listing the one
before several times become hundreds of megabytes (an alias bomb), and the error that printed the value
more. A config never needs an alias, so one is refused where it stands. Nesting is bounded, so a
20000-deep list is an error rather than a RecursionError, and a number too long for Python's int()
is named as such.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 64
"""Deeper than any config needs (facetrain's own go 4 deep), shallow enough for Python's stack."""


class PlainYamlError(Exception):
    """Why text is not plain YAML, in words, with the 1-based line where that is known."""

    def __init__(self, problem: str, line: int | None = None):
        super().__init__(problem)
        self.problem = problem
        self.line = line

    def where(self) -> str:
        return f" line {self.line}" if self.line is not None else ""


class _PlainLoader(yaml.SafeLoader):
    """safe_load's loader that refuses aliases and nesting deeper than MAX_DEPTH as it composes."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise PlainYamlError(
                "aliases (*name) are not read, so that a small file cannot expand to gigabytes; "
                "write the value out in full",
                self.peek_event().start_mark.line + 1,
            )
        if self._depth >= MAX_DEPTH:
            raise PlainYamlError(
                f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark.line + 1
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_plain_yaml(text: str) -> Any:
    """The value `text` holds; PlainYamlError when it is not plain YAML facetrain reads."""
    try:
        return yaml.load(text, Loader=_PlainLoader)  # noqa: S506 (a SafeLoader, stricter still)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or "unreadable"
        if isinstance(error, yaml.constructor.ConstructorError):
            problem += "; only plain YAML is read, no !!python or other language tags"
        raise PlainYamlError(problem, mark.line + 1 if mark else None) from None
    except ValueError as error:  # int() of more digits than Python converts, a date of month 13
        raise PlainYamlError(f"a value cannot be converted ({str(error).split(';')[0][:100]})") from None
