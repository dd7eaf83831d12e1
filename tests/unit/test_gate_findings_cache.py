"""The gate keeps the checks' findings for programs it saw last: a repeated program gets the
same decision, and nothing else (another allowlist, network, language or text) shares it."""

from __future__ import annotations

from sandcell.policy import gate
from sandcell.policy.profiles import load_profile
from sandcell.spec import RunRequest

_CODE = "import requests\nprint(requests.__name__)\n"


def test_a_repeated_program_is_checked_once_and_decided_alike() -> None:
    gate._checked_cached.cache_clear()
    profile = load_profile("strict")
    first = gate.admit(RunRequest(code=_CODE), profile)
    second = gate.admit(RunRequest(code=_CODE), profile)
    info = gate._checked_cached.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    assert first.decision == second.decision
    assert first.decision.findings, "strict should find the import of requests"


def test_the_key_is_everything_the_checks_read() -> None:
    gate._checked_cached.cache_clear()
    strict = load_profile("strict")
    findings = gate._checked(_CODE, "python", strict.import_allowlist(), False)
    allowed = gate._checked(_CODE, "python", {"requests"}, False)
    anything = gate._checked(_CODE, "python", None, False)
    gate._checked(_CODE, "python", {"requests"}, True)  # with a network: another key
    assert any(f.rule_id.startswith("py.") for f in findings)
    assert findings != allowed and allowed == anything
    assert gate._checked_cached.cache_info().misses == 4, "each key is checked on its own"
    # One character more is another program.
    assert gate._checked(_CODE + "#", "python", None, False) is not anything


def test_whether_bash_is_allowed_is_part_of_the_key() -> None:
    # A shell escape is refused where the profile has no Bash and checked as Bash where it has.
    gate._checked_cached.cache_clear()
    escape = "_sandcell_shell('ls')\n"
    with_bash = gate._checked(escape, "python", None, False, bash=True)
    without = gate._checked(escape, "python", None, False, bash=False)
    assert with_bash == ()
    assert [f.rule_id for f in without] == ["py.shell-escape"]
    assert gate._checked_cached.cache_info().misses == 2


def test_large_programs_are_not_kept() -> None:
    gate._checked_cached.cache_clear()
    big = "x = 1\n" * (gate._CACHED_CODE_CHARS // 6 + 1)
    gate.admit(RunRequest(code=big), load_profile("strict"))
    assert gate._checked_cached.cache_info().currsize == 0
