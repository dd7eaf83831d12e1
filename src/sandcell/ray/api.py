"""sandcell for Ray programs: map a Ray Dataset of programs, or run one from a Ray task.

>>> ds = ray.data.from_items([{"code": "print(6*7)"}])                  # doctest: +SKIP
>>> out = ds.map_batches(Programs, concurrency=2, batch_size=8,         # doctest: +SKIP
...                      resources={"sandcell_slots": 1})
>>> ray.get(submit("print(6*7)"))["stdout"]                              # doctest: +SKIP
'42\\n'

Each run is an ordinary sandcell run on the node that executes it: the policy profile, a fresh
sandbox, a record in that node's hash-chained audit log (its home is ``$SANDCELL_HOME`` where the
node's ``ray start`` ran). Asking Ray for one ``sandcell_slots`` per worker keeps a node at the
number of sandboxes it offers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandcell.home import data_dir
from sandcell.ray._ray import SLOTS, import_ray

if TYPE_CHECKING:
    from sandcell.executor import Executor
    from sandcell.spec import RunResult

_executors: dict[tuple[str | None, str | None], Executor] = {}
"""One Executor per (profile, backend) in a Ray worker process, kept between tasks."""


def _executor(profile: str | None, backend: str | None) -> Executor:
    from sandcell.executor import Executor

    key = (profile, backend)
    if key not in _executors:
        _executors[key] = Executor(home=data_dir(), profile=profile, backend=backend)
    return _executors[key]


def _row(result: RunResult, node_id: str) -> dict[str, object]:
    return {
        "outcome": result.outcome.value,
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "reason": result.reason,
        "run_id": result.run_id,
        "node_id": node_id,
    }


def _node_id() -> str:
    ray = import_ray()
    return str(ray.get_runtime_context().get_node_id())


def run_program(
    code: str,
    *,
    language: str = "python",
    stdin: str = "",
    wall_time_s: float | None = None,
    profile: str | None = None,
    backend: str | None = None,
) -> dict[str, object]:
    """Run one program in a fresh sandbox of this process's node; call it inside a Ray task or
    actor. Returns the outcome, exit code, output, run id and node id as plain data."""
    from sandcell.spec import RunRequest, language_named

    # Any name a language goes by (js, ts, sh); an unknown one is a ConfigError naming them.
    lang = language_named(language)
    ex = _executor(profile, backend)
    limits = ex.profile.limits_for({"wall_time_s": wall_time_s} if wall_time_s else {})
    request = RunRequest(
        code=code,
        language=lang,
        stdin=stdin.encode(),
        limits=limits,
    )
    return _row(ex.run(request), _node_id())


def submit(code: str, **options: Any) -> Any:
    """Run ``code`` as a Ray task holding one ``sandcell_slots`` of the node it lands on; returns
    its ObjectRef (``ray.get`` gives :func:`run_program`'s dict). ``options``: as run_program."""
    ray = import_ray()
    task = ray.remote(num_cpus=0, resources={SLOTS: 1}, max_retries=0)(run_program)
    return task.remote(code, **options)


class Programs:
    """A callable class for ``Dataset.map_batches``: each row's ``code`` (and optional ``stdin``,
    ``language``) runs in a fresh sandbox; the batch comes back with outcome, exit_code, stdout,
    stderr, reason, run_id and node_id columns added."""

    def __init__(self, *, profile: str | None = None, backend: str | None = None) -> None:
        self._profile = profile
        self._backend = backend

    def __call__(self, batch: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
        codes = list(batch["code"])
        stdins = list(batch["stdin"]) if "stdin" in batch else [""] * len(codes)
        languages = list(batch["language"]) if "language" in batch else ["python"] * len(codes)
        rows = [
            run_program(
                str(code),
                stdin=str(stdin),
                language=str(language),
                profile=self._profile,
                backend=self._backend,
            )
            for code, stdin, language in zip(codes, stdins, languages, strict=True)
        ]
        out: dict[str, list[Any]] = {k: list(v) for k, v in batch.items()}
        for key in ("outcome", "exit_code", "stdout", "stderr", "reason", "run_id", "node_id"):
            out[key] = [r[key] for r in rows]
        return out


__all__ = ["Programs", "run_program", "submit"]
