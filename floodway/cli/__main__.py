"""``python -m floodway.cli``: the ``floodway`` command."""

from floodway.cli import main

main()
