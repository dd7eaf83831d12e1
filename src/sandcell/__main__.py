"""``python -m sandcell``: the command line."""

from sandcell.cli import entry

entry()
