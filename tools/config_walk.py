"""Where a training run's config travels: every call that hands the run's config tree, or one of its
sections, from one facetrain module to another, counted by the layers of tools/import_contract.py.

    python -m tools.config_walk CONFIG.yaml        # from the repository root

It runs `facetrain train -c CONFIG.yaml` in this process under a profiler and, for each call into a
facetrain function whose arguments include the run's root config (the dataclass whose fields hold the
`model`, `head` and `train` sections) or a section of it, records the caller's module and the callee's.
A call is a *stay* when both modules are in one package, a *descent* when the callee's layer is lower,
*across* between two packages of one layer and a *climb* when the callee's layer is higher (only a
callback can do that under the contract). It also lists the modules that receive the whole tree, where
a section would tell the reader what the code depends on. Layers are looked up by package name, so the
tool measures any checkout, before and after a change of layout (issue 39's "cfg walk").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
from collections import Counter
from pathlib import Path

from tools.import_contract import LAYERS

LAYER_OF = {package: layer for layer, packages in enumerate(LAYERS) for package in packages}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module: str) -> int:
    return LAYER_OF.get(package_of(module), -1)


def is_root(value: object) -> bool:
    return (
        dataclasses.is_dataclass(value)
        and not isinstance(value, type)
        and {"model", "head", "train"} <= {field.name for field in dataclasses.fields(value)}
    )


class Walk:
    """The profiler hook. Every complete root config counts (a run that copies its config is followed
    into each copy), and so does every section of one."""

    def __init__(self) -> None:
        self.roots: set[int] = set()
        self.sections: set[int] = set()
        self.calls: set[tuple[str, str, str]] = set()  # (caller, callee, "root" | "section")

    def learn(self, value: object) -> None:
        fields = [getattr(value, field.name, None) for field in dataclasses.fields(value)]
        if any(field is None for field in fields):
            return  # still being built
        self.roots.add(id(value))
        self.sections |= {id(field) for field in fields if dataclasses.is_dataclass(field)}

    def carried(self, frame) -> str | None:
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        kind = None
        for name in names:
            value = frame.f_locals.get(name)
            if value is None:
                continue
            if id(value) not in self.roots and is_root(value):
                self.learn(value)
            if id(value) in self.roots:
                return "root"
            if id(value) in self.sections:
                kind = "section"
        return kind

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not callee.startswith("facetrain"):
            return
        caller_frame = frame.f_back
        caller = caller_frame.f_globals.get("__name__", "") if caller_frame else ""
        if not caller.startswith("facetrain") or caller == callee and frame.f_code.co_name == "<module>":
            return
        kind = self.carried(frame)
        if kind:
            self.calls.add((caller, callee, kind))


def summarise(walk: Walk) -> dict:
    kinds = Counter()
    climbs = []
    for caller, callee, _ in walk.calls:
        if caller == callee or package_of(caller) == package_of(callee):
            kinds["stays"] += 1
        elif layer_of(callee) < layer_of(caller):
            kinds["descents"] += 1
        elif layer_of(callee) == layer_of(caller):
            kinds["across"] += 1
        else:
            kinds["climbs"] += 1
            climbs.append((caller, callee))
    modules = {callee for _, callee, _ in walk.calls} | {caller for caller, _, _ in walk.calls}
    return {
        "calls": len(walk.calls),
        "modules": len(modules),
        **{kind: kinds[kind] for kind in ("stays", "descents", "across", "climbs")},
        "climbs_between": sorted(set(climbs)),
        "whole_tree": sorted({callee for _, callee, kind in walk.calls if kind == "root"}),
    }


def as_text(summary: dict) -> str:
    lines = [
        f"{summary['calls']} distinct calls carrying the config between {summary['modules']} modules: "
        f"{summary['stays']} stays, {summary['descents']} descents, {summary['across']} across, "
        f"{summary['climbs']} climbs",
        f"{len(summary['whole_tree'])} modules receive the whole tree: {', '.join(summary['whole_tree'])}",
    ]
    if summary["climbs_between"]:
        lines += ["climbs:", *(f"  {caller} -> {callee}" for caller, callee in summary["climbs_between"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    args = parser.parse_args(argv)

    from facetrain.cli import main as facetrain_main

    walk = Walk()
    threading.setprofile(walk)
    sys.setprofile(walk)
    try:
        facetrain_main(["train", "-c", str(args.config), "--quiet"], standalone_mode=False)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    summary = summarise(walk)
    print(json.dumps(summary) if args.json else as_text(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
