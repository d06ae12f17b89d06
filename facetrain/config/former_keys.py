"""Settings that moved to another section keep being read under their former key.

A config file written before the move, a `--set` from an old script, and the config.yaml saved inside
an old run folder or checkpoint still say `train.keep_checkpoints`; the field that took the setting
over declares it (`setting(..., formerly="train.keep_checkpoints")`), and the loader reads the old key
as the new one with one line naming the new key. Both keys given with different values is an error:
neither is plainly the one meant.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import reprlib
import typing
from collections.abc import Mapping
from typing import Any

from facetrain.config.checks import FORMERLY
from facetrain.errors import FacetrainError
from facetrain.logger import logger, rank

_ABSENT = object()


@functools.cache
def former_keys(schema: type) -> dict[str, str]:
    """{former dotted key: its dotted key now} over the dataclass tree `schema`."""
    moved: dict[str, str] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            key = prefix + field.name
            if field.metadata.get(FORMERLY):
                moved[field.metadata[FORMERLY]] = key
            if dataclasses.is_dataclass(hints[field.name]):
                walk(hints[field.name], key + ".")

    walk(schema, "")
    return moved


def read_former_keys(schema: type, raw: dict[str, Any], where) -> dict[str, Any]:
    """`raw` (a whole config as read) with each former key of `schema` moved to its key now, each
    move said in one line; `raw` itself is left as it is. `where(key)` names where a key was given
    (the file or `--set`)."""
    moved = {old: new for old, new in former_keys(schema).items() if _get(raw, old) is not _ABSENT}
    if not moved:
        return raw
    raw = copy.deepcopy(raw)
    for old, new in moved.items():
        value, current = _get(raw, old), _get(raw, new)
        if current is not _ABSENT and current != value:
            raise FacetrainError(
                f"{where(old)}: {old} = {reprlib.repr(value)} and {new} = {reprlib.repr(current)} are one "
                f"setting, {new} now; give it once, as {new}"
            )
        section, _, name = old.rpartition(".")
        del _get(raw, section)[name]
        if not _put(raw, new, value):  # a section above it is not a mapping: from_dict says so
            continue
        if rank() == "0":  # every rank reads a checkpoint's config; one says it
            logger.warning(f"{where(old)}: {old} is now {new}; read as such")
    return raw


def _get(raw: Mapping[str, Any], dotted: str) -> Any:
    node: Any = raw
    for part in dotted.split(".") if dotted else []:
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _put(raw: dict[str, Any], dotted: str, value: Any) -> bool:
    *sections, name = dotted.split(".")
    node = raw
    for part in sections:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return False
    node[name] = value
    return True
