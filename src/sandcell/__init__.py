"""sandcell: run untrusted, model-written code in a disposable sandbox with hard limits, explicit
export and a record of every run.

>>> from sandcell import Executor, RunRequest           # doctest: +SKIP
>>> with Executor() as ex:                              # doctest: +SKIP
...     print(ex.run(RunRequest(code="print(6*7)")).stdout)
42
"""

# Not `from typing import TYPE_CHECKING`: `import sandcell` is the first step of every command
# line call (sandcell._entry), and typing costs more to import than a run through the service.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandcell.artifacts import ArtifactStore, ExportLimits
    from sandcell.audit import AuditLog
    from sandcell.backends.warm import WarmConfig
    from sandcell.errors import (
        AuditError,
        ConfigError,
        InfraError,
        IsolationUnavailable,
        SandcellError,
    )
    from sandcell.executor import Executor
    from sandcell.spec import (
        Artifact,
        Enforcement,
        InputFile,
        IsolationMode,
        Limits,
        Outcome,
        RejectedExport,
        RunRequest,
        RunResult,
        Usage,
        input_from_path,
        result_to_dict,
    )

# Each name is imported on first use (PEP 562): `import sandcell` is on the path of every
# command line call, and most of them need only a few of these (the executor alone imports
# every backend and the validation stack).
_WHERE = {
    "ArtifactStore": "sandcell.artifacts",
    "ExportLimits": "sandcell.artifacts",
    "AuditLog": "sandcell.audit",
    "WarmConfig": "sandcell.backends.namespaces.warm",
    "AuditError": "sandcell.errors",
    "ConfigError": "sandcell.errors",
    "InfraError": "sandcell.errors",
    "IsolationUnavailable": "sandcell.errors",
    "SandcellError": "sandcell.errors",
    "Executor": "sandcell.executor",
    **dict.fromkeys(
        (
            "Artifact",
            "Enforcement",
            "InputFile",
            "IsolationMode",
            "Limits",
            "Outcome",
            "RejectedExport",
            "RunRequest",
            "RunResult",
            "Usage",
            "input_from_path",
            "result_to_dict",
        ),
        "sandcell.spec",
    ),
}


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'sandcell' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted((set(globals()) - {"TYPE_CHECKING"}) | set(_WHERE))


__all__ = [
    "Artifact",
    "ArtifactStore",
    "AuditError",
    "AuditLog",
    "ConfigError",
    "Enforcement",
    "Executor",
    "ExportLimits",
    "InfraError",
    "InputFile",
    "IsolationMode",
    "IsolationUnavailable",
    "Limits",
    "Outcome",
    "RejectedExport",
    "RunRequest",
    "RunResult",
    "SandcellError",
    "Usage",
    "WarmConfig",
    "input_from_path",
    "result_to_dict",
]
