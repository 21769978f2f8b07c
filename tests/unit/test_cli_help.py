"""The CLI describes itself: --version, every option of every command with a help text, and
flags shown as flags."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from floodway.cli.app import app
from floodway.version import __version__

COMMAND: Any = typer.main.get_command(app)  # a group (typer's own click)


def test_version() -> None:
    done = CliRunner().invoke(app, ["--version"])
    assert done.exit_code == 0 and done.stdout.strip() == f"floodway {__version__}"


@pytest.mark.parametrize("name", sorted(COMMAND.commands))
def test_every_option_says_what_it_does(name: str) -> None:
    command = COMMAND.commands[name]
    options = [p for p in command.params if p.param_type_name == "option"]
    undescribed = [p.name for p in options if not p.help]
    assert undescribed == [], f"floodway {name}: options without help: {undescribed}"


@pytest.mark.parametrize("name", ["submit", "batch"])
def test_a_flag_reads_as_one(name: str) -> None:
    done = CliRunner().invoke(app, [name, "--help"], terminal_width=100)
    assert "--wait / --no-wait" in done.stdout and "<bool>" not in done.stdout
