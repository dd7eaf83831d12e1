"""The guest agent as the image holds it: its package imports nothing but the standard library
and its own modules, and loads from the image's layout under the flags /init starts it with."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from sandcell.backends.microvm import guest, image, initramfs

GUEST_DIR = Path(guest.__file__).parent


def test_the_guest_package_imports_only_the_standard_library_and_itself() -> None:
    modules = sorted(GUEST_DIR.glob("*.py"))
    assert len(modules) > 1
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                assert top in sys.stdlib_module_names, f"{path.name} imports {name}"


def test_the_agent_loads_from_the_image_layout_without_sandcell(tmp_path: Path) -> None:
    # The files as the image places them under /opt/sandcell (see image.plan_root).
    opt = tmp_path / "opt-sandcell"
    for name, src in image._AGENT_FILES.items():
        dest = opt / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(src.read_bytes())
    assert {f"guest/{p.name}" for p in GUEST_DIR.glob("*.py")} <= set(image._AGENT_FILES)
    assert initramfs.AGENT_PATH == "/opt/sandcell/agent.py"
    # The entry script as /init runs it, its guest.main stood in for (run() powers a guest off),
    # then the real package from the path the entry set up.
    entry = str(opt / "agent.py")
    probe = (
        "import sys, types\n"
        "calls = []\n"
        "stub = types.ModuleType('guest.main')\n"
        "stub.run = lambda: calls.append('run')\n"
        "sys.modules.update({'guest': types.ModuleType('guest'), 'guest.main': stub})\n"
        f"with open({entry!r}) as f:\n"
        f"    code = compile(f.read(), {entry!r}, 'exec')\n"
        f"exec(code, {{'__name__': '__main__', '__file__': {entry!r}}})\n"
        "assert calls == ['run'], calls\n"
        f"assert sys.path[-1] == {str(opt)!r}, sys.path\n"
        "del sys.modules['guest'], sys.modules['guest.main']\n"
        "import guest.main\n"
        f"assert guest.main.__file__ == {str(opt / 'guest' / 'main.py')!r}\n"
        "assert callable(guest.main.run)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('sandcell', 'typing'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
