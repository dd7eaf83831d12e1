"""The suite's own guards: a run in which every sandbox test skipped fails where sandboxes are
required (CI, ``SANDCELL_REQUIRE_SANDBOX=1``), and passes (skipped) elsewhere.

The nested pytest runs as the ordinary user, where the root-only fixtures skip.
"""

from __future__ import annotations

import subprocess

from tests.conftest import REPO, UnprivEnv

SELECT = "run_ids_are_unique and (root or user) and not gvisor and not microvm"


def _pytest_as_user(env: UnprivEnv, **extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        "runuser", "-u", env.user, "--", "env", "-i", "PATH=/usr/bin:/bin", f"HOME={env.home}",
        f"PYTHONPATH={env.pythonpath}", "PYTHONDONTWRITEBYTECODE=1",
        *(f"{k}={v}" for k, v in extra.items()),
        env.python, "-m", "pytest", "tests/contract/test_contract.py", "-q", "-k", SELECT,
        "-p", "no:cacheprovider", "--basetemp", str(env.home / "pytest-guards"),
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def test_a_run_where_every_sandbox_test_skipped_fails_when_required(unpriv: UnprivEnv) -> None:
    required = _pytest_as_user(unpriv, SANDCELL_REQUIRE_SANDBOX="1")
    assert " skipped" in required.stdout and " passed" not in required.stdout, required.stdout
    assert required.returncode == 1, required.stdout + required.stderr
    assert "sandbox tests were collected and none ran" in required.stdout, required.stdout
    elsewhere = _pytest_as_user(unpriv, CI="", SANDCELL_REQUIRE_SANDBOX="")
    assert elsewhere.returncode == 0, elsewhere.stdout + elsewhere.stderr
    assert "none ran" not in elsewhere.stdout
