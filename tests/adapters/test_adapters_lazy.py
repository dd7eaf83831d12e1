"""No framework is imported until its own adapter is: ``import sandcell`` and the adapters'
shared module stay free of them."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("pydantic_ai", "langchain_core", "agents", "smolagents")


def test_sandcell_and_the_common_module_import_no_framework() -> None:
    probe = (
        "import sys, sandcell, sandcell.adapters, sandcell.adapters.common\n"
        "from sandcell import Executor\n"
        f"print(','.join(m for m in {FRAMEWORKS!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout
