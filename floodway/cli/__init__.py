"""The ``floodway`` command: local commands (``app``), commands that talk to a server
(``remote``, ``batch``) and the demo."""

from floodway.cli.app import main

__all__ = ["main"]
