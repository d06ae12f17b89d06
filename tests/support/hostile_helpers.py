"""Running a command on a hostile input in-process and checking that the user is told one line."""

from __future__ import annotations

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
