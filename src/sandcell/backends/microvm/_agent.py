"""The guest agent's entry script: pid 1 of the microVM (standalone, no sandcell imports).

The initramfs's /init starts it as ``python3 -I -S /opt/sandcell/agent.py``; the agent itself
is the package beside it in the image, ``/opt/sandcell/guest`` (this tree's ``microvm/guest``,
see its docstring). ``-I`` leaves the script's directory off ``sys.path``, so it is added here,
after the standard library's directories: no module of the image shadows one of those.
"""

from __future__ import annotations

import importlib
import os
import sys

if __name__ == "__main__":
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    importlib.import_module("guest.main").run()
