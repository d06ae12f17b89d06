"""Load YAML into a tree of dataclasses, strictly: unknown keys and wrong types are one-line errors.

The loader knows no schema: the caller names the root dataclass (a run's is
`facetrain.train.run_config.Config`), and each field's type and checks say what it accepts.
"""

from __future__ import annotations

import dataclasses
import os
import re
import reprlib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, Union

import yaml

from facetrain.config.checks import is_path_field
from facetrain.config.former_keys import read_former_keys
from facetrain.config.plain_yaml import PlainYamlError, parse_plain_yaml
from facetrain.config.recipes import config_file
from facetrain.errors import FacetrainError
from facetrain.files import atomic_write_text
from facetrain.input_files import read_regular_bytes

T = TypeVar("T")

_EXPONENT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_LIST_INDEX = re.compile(r"\[\d+\]")
MAX_YAML_BYTES = 4 << 20
"""A config is a few kilobytes; this leaves room for long lists of data paths."""


def load_tree(
    schema: type[T], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> T:
    """The dataclass `schema` from YAML file `path` (a recipe's name names a shipped one, or the
    defaults) with `section.key=value` overrides applied."""
    raw: dict[str, Any] = {}
    source = config_source(path)
    if path is not None:
        raw = read_yaml_file(config_file(path), "config") or {}
        if not isinstance(raw, dict):
            raise FacetrainError(f"config {path}: the top level must be a mapping of sections")
    for override in overrides:
        apply_override(raw, override)
    return from_dict(schema, raw, source=source, given=override_origins(overrides))


def config_source(path: str | Path | None) -> str:
    """How messages name where a config came from."""
    return "defaults" if path is None else str(path)


def override_origins(
    overrides: list[str] | tuple[str, ...], options: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The keys that `--set` gave, each mapped to "--set", and those a command's own options gave
    (`options`, e.g. {"train.output_dir": "-o"}), for `where_given`. A key given both ways is refused:
    neither value would be plainly the one the user meant."""
    given = {override.partition("=")[0].strip(): "--set" for override in overrides}
    for key, option in (options or {}).items():
        if key in given:
            raise FacetrainError(f"{option} and --set {key} both set {key}; give one")
        given[key] = option
    return given


def where_given(key: str, source: str, given: Mapping[str, str] | None) -> str:
    """How a message names where `key`'s value came from: the option that set it or a section above it
    (`given`, e.g. {"train.steps": "--set"}), else the config file, so the user looks where they typed it."""
    parts = _LIST_INDEX.sub("", key).split(".")
    for end in range(len(parts), 0, -1):
        option = (given or {}).get(".".join(parts[:end]))
        if option:
            return option
    below = [option for given_key, option in (given or {}).items() if given_key.startswith(f"{key}.")]
    if below:  # `--set nosuch.key=1` made the unknown section `nosuch`: that --set is at fault
        return below[0]
    return f"config {source}" if source else "config"


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Set `section.key=value` in a raw config mapping; the value is parsed as YAML."""
    dotted, sep, value = override.partition("=")
    if not sep or not dotted.strip():
        raise FacetrainError(f"--set {shown(override)}: expected section.key=value")
    keys = dotted.strip().split(".")
    node = raw
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise FacetrainError(f"--set {shown(override)}: {key} is not a section")
    try:
        node[keys[-1]] = parse_plain_yaml(value)
    except PlainYamlError as error:
        raise FacetrainError(
            f"--set {shown(override)}: the value is not valid YAML: {error.problem}"
        ) from None


def from_dict(
    cls: type[T], raw: Any, source: str = "config", prefix: str = "", given: Mapping[str, str] | None = None
) -> T:
    """Build dataclass `cls` from a mapping, checking every key and type; `given`: see `where_given`.
    A whole tree (no `prefix`) reads the keys its settings had before they moved (`former_keys`)."""
    section = prefix.rstrip(".")
    if not isinstance(raw, dict):
        where = where_given(section, source, given)
        raise FacetrainError(f"{where}: {section or 'the top level'} must be a mapping")
    if not prefix:
        raw = read_former_keys(cls, raw, lambda key: where_given(key, source, given))
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(key) for key in raw if key not in fields)
    if unknown:
        key = f"{prefix}{unknown[0]}"
        raise FacetrainError(
            f"{where_given(key, source, given)}: unknown key {key}; valid keys here: {', '.join(sorted(fields))}"
        )
    values = {name: _convert(hints[name], raw[name], source, f"{prefix}{name}", given) for name in raw}
    for name, value in values.items():
        if is_path_field(fields[name]) and isinstance(value, str):
            values[name] = os.path.expanduser(value)
        elif is_path_field(fields[name]) and isinstance(value, list):
            values[name] = [os.path.expanduser(item) for item in value]
    return cls(**values)


def _convert(hint: Any, value: Any, source: str, key: str, given: Mapping[str, str] | None) -> Any:
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, source, key + ".", given)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    where = where_given(key, source, given)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if isinstance(value, list | tuple):  # `str | list[str]`: a list is read as the list option
            options = [a for a in options if typing.get_origin(a) is list] or options
        return _convert(options[0], value, source, key, given)
    if origin is list:
        if not isinstance(value, list | tuple):
            _type_error(where, key, "a list", value)
        return [_convert(args[0], v, source, f"{key}[{i}]", given) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            _type_error(where, key, "a mapping", value)
        return {str(k): _convert(args[1], v, source, f"{key}.{k}", given) for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            _type_error(where, key, "true or false", value)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _type_error(where, key, "an integer", value)
        return value
    if hint is float:
        if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 5e-3 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, int | float):
            _type_error(where, key, "a number", value)
        try:
            return float(value)
        except OverflowError:  # an integer of 400 digits
            raise FacetrainError(
                f"{where}: {key} must be a number a float can hold, got {shown(value)}"
            ) from None
    if hint is str:
        if not isinstance(value, str):
            _type_error(where, key, "a string", value)
        return value
    raise TypeError(f"unsupported config type {hint} for {key}")


def _type_error(where: str, key: str, expected: str, value: Any) -> None:
    raise FacetrainError(f"{where}: {key} must be {expected}, got {shown(value)}")


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother = 3, 8, 8, 80, 80


def shown(value: Any, limit: int = 200) -> str:
    """`value` as a message shows it: a repr of its first items and characters only (reprlib), cut at
    `limit`, so that a huge value (a long list in a file, a long --set) cannot make a line of megabytes."""
    text = _SHOWN.repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def read_yaml_file(path: str | Path, what: str) -> Any:
    """The plain YAML in file `path` (a `what`: "config", "checkpoint config"), in one-line errors:
    not a regular file, over MAX_YAML_BYTES, not UTF-8, not plain YAML."""
    data = read_regular_bytes(path, what, MAX_YAML_BYTES)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise FacetrainError(
            f"{what} {path}: not UTF-8 text (byte {error.start} is {data[error.start]:#04x}); save it as UTF-8"
        ) from None
    try:
        return parse_plain_yaml(text)
    except PlainYamlError as error:
        raise FacetrainError(f"{what} {path}{error.where()}: not valid YAML: {error.problem}") from None


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def save_config(config: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically, so a crash never leaves half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(to_dict(config), sort_keys=False))
