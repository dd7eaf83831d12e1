"""``sandcell run`` through a service: the same request as in-process, sent as ``POST /v1/runs``,
and the result reported by :func:`sandcell.cli.run.report`, so the output is the same.

What only this machine has travels with the request: ``--input`` files are uploaded, the
``--schema`` file is read here and sent; what the run exports comes back: artifacts (and
``--display`` figures) are downloaded for ``--out``. What the service decides for itself
(how sandboxes start, the isolation mode) cannot be asked for here: such an option is refused
with the way to get it (``--no-service``), never ignored.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandcell.cli.remote import Remote, Target, broke_off, checked, read_response
from sandcell.cli.run import (
    check_display,
    parse_env,
    read_code,
    read_stdin,
    report,
    requested_limits,
)
from sandcell.errors import ConfigError, InfraError
from sandcell.spec import Artifact, IsolationMode, input_from_path, result_from_dict

if TYPE_CHECKING:
    from sandcell.artifacts import ArtifactStore

__all__ = [
    "artifact_from_dict",
    "download",
    "input_files",
    "profile_name",
    "refuse_local_only",
    "report_answer",
    "run_remote",
]


def artifact_from_dict(d: Mapping[str, Any]) -> Artifact:
    """An artifact from its JSON form (:func:`sandcell.spec.artifact_to_dict`)."""
    return Artifact(
        path=str(d["path"]),
        sha256=str(d["sha256"]),
        size=int(d["size"]),
        media_type=str(d.get("media_type") or "application/octet-stream"),
    )


def refuse_local_only(options: Iterable[tuple[str, bool]], target: Target) -> None:
    """Refuse the options a service cannot honour, naming them and the way to have them."""
    given = [name for name, used in options if used]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: the service at {target.where} decides this itself; drop "
            f"{'it' if len(given) == 1 else 'them'}, or run here with --no-service"
        )


def profile_name(args: argparse.Namespace, target: Target) -> str | None:
    import os

    name: str | None = args.profile or os.environ.get("SANDCELL_PROFILE") or None
    if name is not None and ("/" in name or name.endswith(".toml")):
        raise ConfigError(
            f"--profile {name}: a service runs its tenants' named profiles, not a file of this "
            f"machine; name one of the tenant's profiles, or run here with --no-service"
        )
    return name


def input_files(paths: Sequence[str]) -> dict[str, str]:
    import base64

    files: dict[str, str] = {}
    for given in paths:
        item = input_from_path(given)
        if item.host_path.is_dir():
            raise ConfigError(
                f"--input {given}: a directory cannot be sent to the service (it takes files); "
                "pass its files one by one, or run here with --no-service"
            )
        if item.name in files:
            raise ConfigError(f"two inputs are both named {item.name!r}; rename one of them")
        try:
            data = item.host_path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read --input {given!r}: {exc.strerror}") from None
        files[item.name] = base64.b64encode(data).decode()
    return files


def request_body(args: argparse.Namespace, target: Target) -> dict[str, object]:
    """The ``POST /v1/runs`` body for this command line."""
    refuse_local_only(
        (
            (f"--isolation {args.isolation}", args.isolation != IsolationMode.STRICT.value),
            ("--no-landlock", args.no_landlock),
            (f"--start {args.start}", args.start is not None),
        ),
        target,
    )
    code = read_code(args)
    check_display(args)
    limits = {k: v for k, v in requested_limits(args).items() if v is not None}
    stdin = read_stdin(args)
    try:
        stdin_text = stdin.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(
            "--stdin: the service takes text (UTF-8) for a program's stdin, and this is not; "
            "run here with --no-service"
        ) from None
    body: dict[str, object] = {
        "code": code,
        "language": args.lang,
        "profile": profile_name(args, target),
        "backend": args.backend,
        "stdin": stdin_text,
        "env": parse_env(args),
        "exports": list(args.export),
        "limits": limits or None,
        "display": bool(args.display),
        **({"runtime": args.runtime} if args.runtime is not None else {}),
        "invariants": list(args.invariant),
        "result_file": args.result_file,
        "files": input_files(args.input),
    }
    if args.schema:
        from sandcell.validation import load_schema

        body["schema"] = dict(load_schema(Path(args.schema)))
    return body


def download(remote: Remote, artifacts: Iterable[Artifact], into: Path) -> ArtifactStore:
    """An artifact store at ``into`` holding ``artifacts``, fetched from the service and
    checked against their SHA-256, so the code that copies artifacts out of a store copies
    these too."""
    import hashlib
    import tempfile

    from sandcell.artifacts import ArtifactStore

    store = ArtifactStore(into)
    for artifact in artifacts:
        if store.has(artifact.sha256):
            continue
        store.path_for(artifact.sha256)  # refuses a digest that is not one, before any request
        data = remote.call("GET", f"/v1/artifacts/{artifact.sha256}").body
        if hashlib.sha256(data).hexdigest() != artifact.sha256:
            raise InfraError(
                f"artifact {artifact.path} came back from the service with other content than "
                f"its SHA-256 {artifact.sha256}"
            )
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.flush()
            f.seek(0)
            store.put_fd(f.fileno(), len(data))
    return store


def run_remote(args: argparse.Namespace, target: Target) -> int:
    """``sandcell run`` through the service; the exit status."""
    remote = Remote(target)
    reply = remote.json("POST", "/v1/runs", body=request_body(args, target))
    result = result_from_dict(reply["result"])
    copied: list[Path] = []
    rendered = ""
    figures = [a for o in result.outputs for a in o.artifacts]
    show = bool(args.display and result.outputs and not args.json)
    wanted = list(result.artifacts) if args.out is not None else []
    if args.display and (show or args.out is not None):
        wanted += figures
    if wanted or show:
        import tempfile

        # As in-process: artifacts copied out of a store, figures rendered from it.
        with tempfile.TemporaryDirectory(prefix="sandcell-download-") as tmp:
            store = download(remote, wanted, Path(tmp))
            if args.out is not None and result.artifacts:
                copied = store.copy_out(result.artifacts, args.out)
            if show:
                from sandcell.cli.render import render_outputs

                out = args.out or Path("sandcell-outputs") / result.run_id
                rendered = render_outputs(result.outputs, store, out)
            elif args.display and args.out is not None and figures:
                copied += store.copy_out(figures, args.out)
    return report(result, as_json=args.json, copied=copied, out=args.out, rendered=rendered)


def report_answer(target: Target, answer: bytes | OSError, *, as_json: bool) -> int:
    """The end of a ``sandcell run`` whose request the fast entry (:mod:`sandcell._entry`) sent
    and whose whole answer it read (or the error that stopped it) but did not find plain enough
    to print itself: the same errors and report as :func:`run_remote` for a run without
    downloads."""
    import io

    if isinstance(answer, OSError):
        raise broke_off(target, answer)
    try:
        response = read_response(io.BytesIO(answer))
    except ValueError as exc:
        raise broke_off(target, exc) from None
    reply = checked(response, target).json()
    result = result_from_dict(reply["result"])
    return report(result, as_json=as_json, copied=[], out=None)
