"""Running a command on a hostile input in-process and checking that the user is told one line."""

from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner

from facetrain.cli import main


def one_line_error(*args: object) -> str:
    """Run `facetrain ARGS`; assert it failed with exit 2 and one `error:` line on stderr; return it."""
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def fake_checkpoint(run: Path, config_yaml: str | None) -> Path:
    """A run folder whose one checkpoint's small files are whole, but for config.yaml (a FIFO when None)."""
    checkpoint = run / "checkpoints" / "step_00000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / ".metadata").write_bytes(b"")
    (checkpoint / "meta.json").write_text('{"step": 2}')
    (checkpoint / "classes.json").write_text("[]")
    if config_yaml is None:
        os.mkfifo(checkpoint / "config.yaml")
    else:
        (checkpoint / "config.yaml").write_text(config_yaml)
    (run / "checkpoints" / "last").write_text(checkpoint.name)
    return checkpoint
