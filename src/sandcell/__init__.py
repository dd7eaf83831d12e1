"""sandcell: run untrusted, model-written code in a disposable sandbox with hard limits, explicit
export and a record of every run.

>>> from sandcell import Executor, RunRequest           # doctest: +SKIP
>>> with Executor() as ex:                              # doctest: +SKIP
...     print(ex.run(RunRequest(code="print(6*7)")).stdout)
42
"""

from sandcell.artifacts import ArtifactStore, ExportLimits
from sandcell.audit import AuditLog
from sandcell.backends.namespaces.warm import WarmConfig
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
