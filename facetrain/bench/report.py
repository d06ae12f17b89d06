"""The one report writer of every benchmark: its JSON, its markdown tables and its plots.

A benchmark describes its outputs once (`ReportFiles`: the JSON's name, the markdown file's name if it
writes one, each plot's name and drawing) and supplies its tables' columns and cells; how a table is
laid out, how a byte count reads and where each file goes is written here only. Every file is written
atomically, so an interrupted benchmark leaves the previous report whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from facetrain.files import write_atomic

Plot = Callable[[dict, Path], None]


@dataclass(frozen=True)
class ReportFiles:
    """What a benchmark writes into its output folder: `json`, each of `plots` (key -> file name and the
    function that draws it from the report), and `table` (the markdown, when it is kept in a file)."""

    json: str
    table: str | None = None
    plots: Mapping[str, tuple[str, Plot]] = field(default_factory=dict)

    @property
    def names(self) -> dict[str, str]:
        """Each output's file name by key ("json", the plots' keys, "table")."""
        names = {"json": self.json} | {key: name for key, (name, _) in self.plots.items()}
        return names | ({"table": self.table} if self.table else {})


def write_report(out: Path, report: dict, table: str, files: ReportFiles) -> str:
    """Write the report's JSON, its plots and its markdown table into the folder `out`; return the table."""
    write_atomic(out / files.json, lambda tmp: tmp.write_text(json.dumps(report, indent=2) + "\n"))
    for name, draw in files.plots.values():
        write_atomic(out / name, lambda tmp, draw=draw: draw(report, tmp))
    if files.table:
        write_atomic(out / files.table, lambda tmp: tmp.write_text(table))
    return table


def markdown_table(
    titles: Sequence[str], rows: Iterable[Sequence[str]], numeric: Collection[str] = ()
) -> list[str]:
    """A markdown table's lines: the titles, the rule (columns named in `numeric` aligned right), a line
    per row of cells."""
    rule = "|" + "".join("---:|" if title in numeric else "---|" for title in titles)
    return ["| " + " | ".join(titles) + " |", rule, *("| " + " | ".join(cells) + " |" for cells in rows)]


def report_footer(report: dict) -> list[str]:
    """The closing lines of a benchmark's markdown: each target's verdict, then the machine."""
    machine = report["machine"]
    load = " ".join(f"{x:.2f}" for x in machine["load_average_1_5_15"])
    return [
        "",
        *(f"- {t['status']}: {t['name']} {t['threshold']}: {t['detail']}" for t in report["targets"]),
        "",
        f"{machine['cpu_model']}, {machine['cores']} cores, torch {machine['torch']}, {machine['date']}, "
        f"load average {load}",
    ]


def format_bytes(value: float) -> str:
    units = ["B", "KiB", "MiB", "GiB"]
    index = 0
    while abs(value) >= 1024 and index < len(units) - 1:
        value /= 1024
        index += 1
    return f"{value:.0f} B" if index == 0 else f"{value:.1f} {units[index]}"
