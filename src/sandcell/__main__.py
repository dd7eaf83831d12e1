"""``python -m sandcell``: the command line, through the first step the installed one takes."""

from sandcell._entry import entry

entry()
