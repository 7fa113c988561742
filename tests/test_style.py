"""The code style is part of the test command: `ruff check` and `ruff format --check` pass on the
whole repository (settings in ruff.toml; fix with `ruff check --fix .` and `ruff format .`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests._harness import ROOT


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_passes_on_the_repository(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"ruff {' '.join(command)} failed:\n{result.stdout}{result.stderr}"
