"""The contenders of ``compare.py``: how each runs one program, and what it isolates.

Every variant turns (code, expected output) into a :data:`_common.Runner` that raises unless the
program printed what it should, so a variant that silently did nothing cannot look fast. A variant
that cannot be set up on this host is returned as a :class:`VariantInfo` with ``available=False``
and the exact reason, never dropped silently.

``smolagents`` is measured for reference only: its ``LocalPythonExecutor`` interprets the program's
AST inside the calling process. It is not an isolation boundary.
"""

from __future__ import annotations

import importlib
import queue
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from _common import Runner, bwrap_argv, python_argv, subprocess_runner
from _results import VariantInfo

__all__ = [
    "ALL_VARIANTS",
    "Variant",
    "build_variant",
    "load_warm_config",
    "open_warm_executor",
]

ALL_VARIANTS = (
    "python",
    "bwrap",
    "sandcell-cold",
    "sandcell-pool",
    "sandcell-pool-bare",
    "sandcell-template",
    "llm-sandbox",
    "llm-sandbox-fresh",
    "smolagents",
)
PRELOAD = ("numpy", "pandas")


class Variant(Protocol):
    @property
    def info(self) -> VariantInfo: ...

    def runner(self, code: str, expect: str) -> Runner: ...

    def close(self) -> None: ...


def _dist_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "(version unknown)"


@dataclass
class _Subprocess:
    """The bare baselines: one new process (tree) per run."""

    info: VariantInfo
    argv: Callable[[str], list[str]]

    def runner(self, code: str, expect: str) -> Runner:
        return subprocess_runner(self.argv(code), expect=expect)

    def close(self) -> None:
        return None


@dataclass
class _Sandcell:
    """One sandcell Executor (profile ``unchecked``: the sandbox alone, every layer and limit)."""

    base: VariantInfo
    executor: Any
    modes: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def info(self) -> VariantInfo:
        seen = ", ".join(f"{m} {n}" for m, n in self.modes.most_common())
        note = self.base.note
        if seen:
            note = f"{note}; runs started as: {seen}" if note else f"runs started as: {seen}"
        return VariantInfo(self.base.key, self.base.label, self.base.isolation, True, note)

    def runner(self, code: str, expect: str) -> Runner:
        from sandcell import Outcome, RunRequest

        request = RunRequest(code=code)

        def run() -> None:
            r = self.executor.run(request)
            with self._lock:
                self.modes[r.start.mode] += 1
            if r.outcome is not Outcome.OK:
                raise RuntimeError(f"sandcell run {r.outcome.value}: {r.reason}: {r.stderr[-500:]}")
            if expect not in r.stdout:
                raise RuntimeError(f"sandcell run did not print {expect!r}: {r.stdout[-200:]!r}")

        return run

    def close(self) -> None:
        self.executor.close()


def load_warm_config() -> tuple[Any, str | None]:
    """sandcell's ``WarmConfig`` class, or None and why it cannot be used."""
    errors = []
    for module, name in (("sandcell.backends.namespaces.warm", "WarmConfig"), ("sandcell", "")):
        try:
            cls = getattr(importlib.import_module(module), name or "WarmConfig")
        except (ImportError, AttributeError) as exc:
            errors.append(f"{module}: {exc}")
            continue
        return cls, None
    return None, "this sandcell has no WarmConfig (" + errors[0] + ")"


def open_warm_executor(
    mode: str, *, home: Path, pool_size: int, preload: tuple[str, ...] = PRELOAD
) -> tuple[Any, str | None]:
    """A sandcell Executor whose runs start warm in ``mode``, or None and why not.

    One run is made and must report ``start.mode == mode``: an option that is accepted but falls
    back to cold starts is reported, not measured under the wrong name.
    """
    from sandcell import Executor, RunRequest

    cfg_cls, why = load_warm_config()
    if cfg_cls is None:
        return None, why
    try:
        cfg = cfg_cls(mode=mode, preload=preload, pool_size=pool_size)
        # The keyword goes through a mapping: an Executor without warm starts is a reported
        # outcome of this benchmark, not a type error in it.
        kwargs: dict[str, Any] = {"warm": cfg}
        ex = Executor(home=home, profile="unchecked", **kwargs)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        r = ex.run(RunRequest(code="print(1)"))
    except Exception as exc:
        ex.close()
        return None, f"first run: {type(exc).__name__}: {exc}"
    if r.start.mode != mode:
        ex.close()
        return None, f"asked for mode={mode!r}, the first run started as {r.start.mode!r}"
    return ex, None


def _sandcell(key: str, home: Path, pool_size: int) -> Variant | VariantInfo:
    from sandcell import Executor

    mode = key.removeprefix("sandcell-")
    if mode == "cold":
        info = VariantInfo(key, "sandcell, a new sandbox per run", "fresh sandbox per run")
        return _Sandcell(info, Executor(home=home, profile="unchecked"))
    # "pool-bare": a pool whose template imports nothing beyond the standard library, as for
    # HumanEval-like batches: a smaller image to fork, so more sandboxes per second.
    preload = () if mode == "pool-bare" else PRELOAD
    label = {
        "pool": f"sandcell warm pool ({pool_size} pre-started, {'+'.join(PRELOAD)} imported)",
        "pool-bare": f"sandcell warm pool ({pool_size} pre-started, nothing preloaded)",
        "template": f"sandcell template fast path ({'+'.join(PRELOAD)} imported)",
    }[mode]
    isolation = "fresh sandbox per run, started warm"
    ex, why = open_warm_executor(
        mode.removesuffix("-bare"), home=home, pool_size=pool_size, preload=preload
    )
    if ex is None:
        return VariantInfo(key, label, isolation, False, str(why))
    return _Sandcell(VariantInfo(key, label, isolation), ex)


@dataclass
class _LlmSandbox:
    """llm-sandbox's bubblewrap backend (``SandboxSession(backend="bubblewrap")``).

    ``fresh=False``: sessions opened ahead (one per concurrent caller) and reused; every run is a
    new bwrap (new namespaces) but the session's workspace and /tmp persist from run to run.
    ``fresh=True``: a new session (workspace) per run, closed after it.
    """

    info: VariantInfo
    make: Callable[[], Any]
    fresh: bool
    sessions: queue.Queue[Any] = field(default_factory=queue.Queue)
    opened: list[Any] = field(default_factory=list)

    def prepare(self, n: int) -> None:
        for _ in range(n):
            s = self.make()
            s.open()
            self.opened.append(s)
            self.sessions.put(s)

    def runner(self, code: str, expect: str) -> Runner:
        def check(out: Any) -> None:
            if out.exit_code != 0:
                raise RuntimeError(f"llm-sandbox run exited {out.exit_code}: {out.stderr[-500:]}")
            if expect not in out.stdout:
                raise RuntimeError(f"llm-sandbox did not print {expect!r}: {out.stdout[-200:]!r}")

        def run_fresh() -> None:
            with self.make() as s:
                check(s.run(code))

        def run_reused() -> None:
            s = self.sessions.get()
            try:
                check(s.run(code))
            finally:
                self.sessions.put(s)

        return run_fresh if self.fresh else run_reused

    def close(self) -> None:
        for s in self.opened:
            s.close()


def _llm_sandbox(key: str, sessions: int) -> Variant | VariantInfo:
    fresh = key.endswith("-fresh")
    label = "llm-sandbox, bubblewrap backend" + (", a new session per run" if fresh else "")
    isolation = (
        "new namespaces and workspace per run"
        if fresh
        else "new namespaces per run; workspace kept across a session's runs"
    )
    try:
        from llm_sandbox import SandboxSession  # type: ignore[import-untyped]
        from llm_sandbox.local.config import (  # type: ignore[import-untyped]
            DEFAULT_READ_ONLY_PATHS,
            LocalSandboxConfig,
        )
    except ImportError as exc:
        why = f"llm-sandbox is not installed ({exc}); pip install -e '.[bench]'"
        return VariantInfo(key, label, isolation, False, why)
    from sandcell.backends.host.bubblewrap import find_bwrap
    from sandcell.runtimes import python_runtime

    rt = python_runtime()
    # The same interpreter and bwrap binary as sandcell; its directories added to llm-sandbox's
    # default read-only set, else the interpreter is not inside its sandbox.
    config = LocalSandboxConfig(
        python_executable=rt.interpreter,
        read_only_paths=tuple(dict.fromkeys((*DEFAULT_READ_ONLY_PATHS, *rt.ro_dirs))),
    )

    def make() -> Any:
        return SandboxSession(
            backend="bubblewrap",
            lang="python",
            bwrap_path=find_bwrap().path,
            sandbox_config=config,
            # Its Python setup makes a venv per session; the runtime already has every package.
            skip_environment_setup=True,
        )

    note = (
        f"llm-sandbox {_dist_version('llm-sandbox')}: seccomp denylist, rlimits "
        "only when asked (none here), no cgroup, no Landlock"
    )
    if fresh:
        note += "; opening a session launches one extra bwrap (its open() probes the sandbox)"
    v = _LlmSandbox(VariantInfo(key, label, isolation, True, note), make, fresh)
    try:
        if not fresh:
            v.prepare(sessions)
        v.runner("print(1)", "1")()
    except Exception as exc:
        v.close()
        return VariantInfo(key, label, isolation, False, f"{type(exc).__name__}: {exc}")
    return v


@dataclass
class _Smolagents:
    """smolagents' ``LocalPythonExecutor``, a new one per run (state does not carry over)."""

    info: VariantInfo
    cls: Any

    def runner(self, code: str, expect: str) -> Runner:
        def run() -> None:
            ex = self.cls(additional_authorized_imports=["pandas"])
            ex.send_tools({})
            out = ex(code)
            if expect not in out.logs:
                raise RuntimeError(f"smolagents did not print {expect!r}: {out.logs[-200:]!r}")

        return run

    def close(self) -> None:
        return None


def _smolagents(key: str) -> Variant | VariantInfo:
    label = "smolagents LocalPythonExecutor (reference)"
    isolation = "NOT an isolation boundary: AST interpreter in the caller's process"
    try:
        from smolagents.local_python_executor import (  # type: ignore[import-untyped]
            LocalPythonExecutor,
        )
    except ImportError as exc:
        why = f"smolagents is not installed ({exc}); pip install -e '.[bench]'"
        return VariantInfo(key, label, isolation, False, why)
    note = (
        f"smolagents {_dist_version('smolagents')}: interprets Python in Python, so loops run "
        "far slower than CPython; threads share one GIL"
    )
    return _Smolagents(VariantInfo(key, label, isolation, True, note), LocalPythonExecutor)


def build_variant(key: str, *, home: Path, pool_size: int) -> Variant | VariantInfo:
    """The variant named ``key``, or why it is not available here."""
    if key == "python":
        info = VariantInfo(key, "bare python -I -c", "none: a new process per run")
        return _Subprocess(info, python_argv)
    if key == "bwrap":
        info = VariantInfo(key, "bare bubblewrap + python", "new namespaces per run, nothing else")
        return _Subprocess(info, bwrap_argv)
    if key.startswith("sandcell-"):
        try:
            return _sandcell(key, home / key, pool_size)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            return VariantInfo(key, key, "fresh sandbox per run", False, why)
    if key.startswith("llm-sandbox"):
        return _llm_sandbox(key, pool_size)
    if key == "smolagents":
        return _smolagents(key)
    raise ValueError(f"unknown variant {key!r}; choose from {', '.join(ALL_VARIANTS)}")
