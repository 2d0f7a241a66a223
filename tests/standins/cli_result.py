"""What the CLI tests read from a finished opsctl invocation (a CliRunner result)."""

from __future__ import annotations


def error_lines(result) -> list[str]:
    """The ``opsctl: error:`` lines the invocation wrote on stderr."""
    return [line for line in result.stderr.splitlines() if line.startswith("opsctl: error:")]


def assert_bad_input(result, needle: str) -> None:
    """Assert exit 2 with one error line that names ``needle``, and nothing on stdout."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = error_lines(result)
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert result.stdout == ""
