"""The isolation ladder: backend names, the profile's [isolation] section, and the executor
refusing a rung below the profile's minimum (never moving a run to another rung)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandcell import Executor, RunRequest
from sandcell.backends import registry
from sandcell.backends.namespaces import NamespacesBackend
from sandcell.errors import ConfigError
from sandcell.policy.profiles import ProfileError, load_profile, parse_profile, render_matrix

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the executor tests here run as root")


def test_the_ladder_is_ordered_weakest_first() -> None:
    assert registry.LADDER == ("namespaces", "wasm", "gvisor", "microvm")
    ranks = [registry.rank(name) for name in ("namespaces", "wasm", "gvisor", "microvm")]
    assert ranks == sorted(ranks) and len(set(ranks)) == 4
    assert set(registry.PROTECTS) == set(registry.LADDER)


def test_an_unknown_backend_lists_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="unknown backend 'docker'; choose one of namespaces"):
        registry.check_name("docker")
    monkeypatch.setenv(registry.ENV_BACKEND, "firecracker")
    with pytest.raises(ConfigError, match=r"\$SANDCELL_BACKEND 'firecracker'"):
        registry.requested_backend(None)


def test_the_environment_names_the_backend_unless_the_caller_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(registry.ENV_BACKEND, raising=False)
    assert registry.requested_backend(None) is None
    monkeypatch.setenv(registry.ENV_BACKEND, "gvisor")
    assert registry.requested_backend(None) == "gvisor"
    assert registry.requested_backend("microvm") == "microvm"


def test_isolation_section_defaults_and_refusals() -> None:
    absent = parse_profile(b"", name="p", source="p.toml")
    assert (absent.isolation.backend, absent.isolation.minimum) == ("namespaces", "namespaces")
    # A minimum alone makes the default the weakest rung it allows.
    only_min = parse_profile(b'[isolation]\nminimum = "gvisor"\n', name="p", source="p.toml")
    assert only_min.isolation.backend == "gvisor"
    assert only_min.backend_for(None) == "gvisor"
    assert only_min.backend_for("microvm") == "microvm"
    with pytest.raises(ConfigError, match="weaker than the minimum 'gvisor' of profile 'p'"):
        only_min.backend_for("namespaces")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[isolation]\nbackend = "docker"\n', "unknown backend 'docker'"),
        ('[isolation]\nminimum = "vm"\n', "unknown minimum 'vm'"),
        (
            '[isolation]\nbackend = "namespaces"\nminimum = "microvm"\n',
            "weaker than the minimum 'microvm'",
        ),
        ('[isolation]\nfallback = "namespaces"\n', "fallback"),
    ],
)
def test_bad_isolation_sections_point_at_the_line(text: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message) as info:
        parse_profile(text.encode(), name="p", source="p.toml")
    assert str(info.value).startswith("p.toml:2: ")


def test_the_hostile_builtin_needs_a_microvm(tmp_path: Path) -> None:
    hostile = load_profile("hostile", profile_dir=tmp_path)
    assert (hostile.isolation.backend, hostile.isolation.minimum) == ("microvm", "microvm")
    for weaker in ("namespaces", "wasm", "gvisor"):
        with pytest.raises(ConfigError, match="ask for microvm"):
            hostile.backend_for(weaker)
    matrix = render_matrix(hostile)
    assert "isolation" in matrix and "microvm" in matrix
    for name in ("strict", "analysis", "supervised", "unchecked"):
        assert load_profile(name, profile_dir=tmp_path).backend_for(None) == "namespaces"


def test_the_pure_builtin_chooses_the_wasm_rung_and_python_only(tmp_path: Path) -> None:
    pure = load_profile("pure", profile_dir=tmp_path)
    assert pure.backend_for(None) == "wasm"
    # Any rung may be asked for by name (a program that needs numpy: namespaces).
    assert pure.backend_for("namespaces") == "namespaces"
    assert pure.runtime.languages == ("python",)
    assert pure.network.mode == "none"
    assert "pure-Python packages only" in pure.description


@needs_root
def test_the_executor_refuses_a_rung_below_the_minimum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(registry.ENV_BACKEND, raising=False)
    with pytest.raises(ConfigError, match="weaker than the minimum 'microvm'"):
        Executor(home=tmp_path, profile="hostile", backend="namespaces")
    # A backend object counts as asking for its rung.
    with Executor(home=tmp_path, profile="unchecked", backend=NamespacesBackend()) as ex:
        with pytest.raises(ConfigError, match="weaker than the minimum 'microvm'"):
            ex.run(RunRequest(code="print(1)"), profile="hostile")
        ok = ex.run(RunRequest(code="print(6*7)"))
        assert ok.stdout == "42\n"
        entry = ex.audit.get(ok.run_id)
        assert entry is not None
        record = entry.record
        assert isinstance(record, dict) and record["backend"]["name"] == "namespaces"
    monkeypatch.setenv(registry.ENV_BACKEND, "namespaces")
    with pytest.raises(ConfigError, match="weaker than the minimum"):
        Executor(home=tmp_path, profile="hostile")


@needs_root
def test_warm_with_a_backend_object_is_refused(tmp_path: Path) -> None:
    from sandcell.backends.warm import WarmConfig

    with pytest.raises(ConfigError, match="backend built by name"):
        Executor(home=tmp_path, backend=NamespacesBackend(), warm=WarmConfig())


@needs_root
def test_an_approval_keeps_the_backend_it_was_submitted_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(registry.ENV_BACKEND, raising=False)
    with Executor(home=tmp_path, profile="supervised", backend="namespaces") as ex:
        waiting = ex.run(RunRequest(code="print(6*7)"))
        assert waiting.outcome.value == "awaiting_approval"
        approval = waiting.policy["approval"]  # type: ignore[index]
        ticket = ex.approvals.get(approval["id"])
        assert ticket.profile["backend"] == "namespaces"
    with Executor(home=tmp_path, profile="supervised") as ex:
        ran = ex.run_approved(ticket.id, by="test")
        assert ran.stdout == "42\n"
        entry = ex.audit.get(ran.run_id)
        assert entry is not None
        record = entry.record
        assert isinstance(record, dict) and record["backend"]["name"] == "namespaces"
