"""Landlock: the plan (pure), require() semantics, and the boot script's real behaviour.

The behaviour tests run the boot in a subprocess without bubblewrap, with a plan that points at
temporary directories, so they need Landlock in the kernel but no privileges.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import pytest

from sandcell.backends import inside
from sandcell.backends.host import landlock as L
from sandcell.errors import ConfigError, IsolationUnavailable

BOOT = inside.BOOT_SCRIPT
ABI = L.probe_abi()
needs_landlock = pytest.mark.skipif(ABI is None, reason=f"Landlock not available: {L._probe()[1]}")


def plan_for(abi: int, **kw: object) -> L.LandlockPlan:
    return L.build_plan(
        runtime_paths=["/usr", "/opt/py", "/usr"],
        input_dir=kw.pop("input_dir", "/inputs"),  # type: ignore[arg-type]
        abi=abi,
        **kw,  # type: ignore[arg-type]
    )


# -- the plan, pure ---------------------------------------------------------------------------


def test_handled_fs_grows_with_the_abi() -> None:
    base = (1 << 13) - 1
    assert L.handled_fs(1) == base
    assert L.handled_fs(2) == base | L.ACCESS_FS_REFER
    assert L.handled_fs(3) == base | L.ACCESS_FS_REFER | L.ACCESS_FS_TRUNCATE
    assert L.handled_fs(4) == L.handled_fs(3)
    assert L.handled_fs(5) == L.handled_fs(3) | L.ACCESS_FS_IOCTL_DEV
    assert L.handled_fs(6) == L.handled_fs(7) == L.handled_fs(5)


def test_network_and_scopes_by_abi() -> None:
    assert L.handled_net(3, deny_tcp=True) == 0
    assert L.handled_net(4, deny_tcp=True) == L.ACCESS_NET_BIND_TCP | L.ACCESS_NET_CONNECT_TCP
    assert L.handled_net(7, deny_tcp=False) == 0
    assert L.scopes(5, signals=True, abstract_unix=True) == 0
    assert L.scopes(6, signals=True, abstract_unix=True) == (
        L.SCOPE_SIGNAL | L.SCOPE_ABSTRACT_UNIX_SOCKET
    )
    assert L.scopes(7, signals=True, abstract_unix=False) == L.SCOPE_SIGNAL
    assert L.scopes(7, signals=False, abstract_unix=True) == L.SCOPE_ABSTRACT_UNIX_SOCKET


def test_build_plan_categories() -> None:
    plan = plan_for(7)
    assert plan.read_exec == ("/usr", "/opt/py")  # de-duplicated, order kept
    assert plan.read_only[:3] == ("/inputs", "/sandcell", "/proc")
    assert {"/dev/urandom", "/dev/random", "/etc/passwd"} <= set(plan.read_only)
    assert plan.read_write[:2] == ("/work", "/tmp")
    assert {"/dev/null", "/dev/zero", "/dev/full"} <= set(plan.read_write)
    assert plan.deny_tcp and plan.scope_signals and plan.scope_abstract_unix and plan.required
    assert "/inputs" not in plan_for(7, input_dir=None).read_only


@pytest.mark.parametrize("abi", [1, 2, 3, 4, 5, 6, 7])
def test_rules_only_name_handled_rights(abi: int) -> None:
    plan = plan_for(abi)
    rules = dict(plan.rules)
    handled = L.handled_fs(abi)
    assert all(r & ~handled == 0 for r in rules.values())
    assert rules["/usr"] == L.RIGHTS_READ_EXEC
    assert rules["/inputs"] == L.RIGHTS_READ_ONLY
    rw = rules["/work"]
    assert rw & L.ACCESS_FS_WRITE_FILE and rw & L.ACCESS_FS_MAKE_REG
    assert not rw & (L.ACCESS_FS_MAKE_CHAR | L.ACCESS_FS_MAKE_BLOCK)
    assert bool(rw & L.ACCESS_FS_REFER) == (abi >= 2)
    assert bool(rw & L.ACCESS_FS_TRUNCATE) == (abi >= 3)
    assert bool(rw & L.ACCESS_FS_IOCTL_DEV) == (abi >= 5)
    compiled = plan.ruleset()
    assert compiled["file_rights"] == L.ACCESS_FILE & handled
    assert compiled["handled_net"] == (3 if abi >= 4 else 0)
    assert compiled["scoped"] == (3 if abi >= 6 else 0)


def test_repeated_paths_merge_their_rights() -> None:
    plan = L.LandlockPlan(read_exec=("/a",), read_only=("/a",), read_write=("/a", "/b"), abi=3)
    rules = dict(plan.rules)
    assert list(rules) == ["/a", "/b"]
    assert rules["/a"] == rules["/b"] == L.RIGHTS_READ_WRITE & L.handled_fs(3)


@pytest.mark.parametrize(
    "bad",
    [
        {"read_exec": ("usr",)},
        {"read_exec": ["/usr"]},
        {"read_only": ("/a\x00b",)},
        {"abi": 0},
        {"abi": True},
    ],
)
def test_invalid_plans_are_refused(bad: dict[str, object]) -> None:
    fields: dict[str, object] = {"read_exec": (), "read_only": (), "read_write": (), "abi": 7}
    fields.update(bad)
    with pytest.raises(ConfigError):
        L.LandlockPlan(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("abi", [1, 3, 4, 6, 7])
def test_json_round_trip(abi: int) -> None:
    plan = plan_for(abi, required=False)
    text = plan.to_json()
    doc = json.loads(text)
    assert doc["format"] == L.PLAN_FORMAT
    assert doc["status_fd"] is None and doc["input_links"] == []
    assert doc["landlock"]["ruleset"]["rules"] == [[p, r] for p, r in plan.rules]
    assert L.LandlockPlan.from_json(text) == plan


def test_from_json_refuses_a_tampered_ruleset() -> None:
    doc = json.loads(plan_for(7).to_json())
    doc["landlock"]["ruleset"]["rules"][0][1] |= L.ACCESS_FS_WRITE_FILE
    with pytest.raises(ConfigError, match="does not match"):
        L.LandlockPlan.from_json(json.dumps(doc))
    with pytest.raises(ConfigError):
        L.LandlockPlan.from_json(L.boot_plan_json(plan=None))
    with pytest.raises(ConfigError):
        L.LandlockPlan.from_json("{")


def test_boot_plan_json() -> None:
    doc = json.loads(
        L.boot_plan_json(plan=plan_for(7), status_fd=5, input_links=[("d.csv", "/inputs/d.csv")])
    )
    assert doc["status_fd"] == 5
    assert doc["input_links"] == [["d.csv", "/inputs/d.csv"]]
    with pytest.raises(ConfigError):
        L.boot_plan_json(plan=None, status_fd=2)
    assert "supervised" not in doc
    assert json.loads(L.boot_plan_json(plan=None, status_fd=5, supervised=True))["supervised"]
    # Supervised by a pid 1 above: it reports on the status descriptor, and the bridge and
    # ingress agent would be the boot's children, not pid 1's.
    for bad in ({"status_fd": None}, {"status_fd": 5, "bridge": ["/b.py"]}):
        with pytest.raises(ConfigError):
            L.boot_plan_json(plan=None, supervised=True, **bad)  # type: ignore[arg-type]


def test_describe() -> None:
    text = L.describe(L.LandlockPlan(read_exec=("/usr",), read_only=(), read_write=("/w",), abi=7))
    assert text == (
        "landlock ABI 7: fs restricted to 2 paths, tcp denied, "
        "signals and abstract unix sockets scoped"
    )
    assert "tcp not restricted" in L.describe(plan_for(3))
    assert "no IPC scoping" in L.describe(plan_for(5))
    assert "tcp denied" in L.describe(plan_for(5))


def test_boot_command() -> None:
    cmd = L.boot_command("/usr/bin/python3", ["/sandcell/main.py", "x"], mode="python")
    assert cmd == [
        "/usr/bin/python3", "-I", "/sandcell/boot.py", "/sandcell/plan.json", "python",
        "/sandcell/main.py", "x",
    ]  # fmt: skip
    assert L.boot_command("/p", ["/bin/bash", "/sandcell/main.sh"], mode="exec")[4] == "exec"


# -- require() --------------------------------------------------------------------------------


def test_require_semantics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(L, "_probe", lambda: (None, "the kernel has no Landlock support"))
    with pytest.raises(IsolationUnavailable) as info:
        L.require(True)
    assert info.value.layer == "landlock"
    assert "no Landlock support" in info.value.reason
    assert "kernel >= 5.13" in info.value.fix and "landlock disabled" in info.value.fix
    assert L.require(None) is None
    assert L.require(False) is None

    monkeypatch.setattr(L, "_probe", lambda: (6, ""))
    assert L.require(True) == 6
    assert L.require(None) == 6
    assert L.require(False) is None


def test_probe_is_cached_and_consistent() -> None:
    assert L.probe_abi() == L.probe_abi() == L.require(None)
    assert ABI is None or ABI >= 1


# -- the boot script, statically ----------------------------------------------------------------


def _load_boot() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sandcell_boot_under_test", BOOT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_boot_is_standalone() -> None:
    tree = ast.parse(BOOT.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    # typing only under TYPE_CHECKING; json only where _json is missing.
    assert imported <= {
        "__future__",
        "os",
        "sys",
        "typing",
        "_json",
        "json",
        "_ctypes",
        "_signal",
        "gc",
        "io",  # built in, loaded at every start: stdio reopened unbuffered (PYTHONUNBUFFERED)
        "select",  # only when a non-blocking stdout pipe is full
    }


def test_boot_parses_plans_like_json() -> None:
    boot = _load_boot()
    text = L.boot_plan_json(
        plan=L.build_plan(runtime_paths=["/usr", "/ü/ñ", "/a\udcff"], input_dir=None, abi=7),
        status_fd=9,
        input_links=[("a b", "/inputs/a b")],
    )
    assert boot._parse_json(text) == json.loads(text)
    with pytest.raises(ValueError):
        boot._parse_json('{"a": 1} x')
    with pytest.raises(ValueError):
        boot._parse_json("")


# -- the boot script, for real --------------------------------------------------------------------


@dataclass
class Sandbox:
    root: Path
    work: Path
    tmp: Path
    control: Path
    inputs: Path
    secret: Path

    def plan(self, **kw: object) -> L.LandlockPlan:
        assert ABI is not None
        runtime = {sys.prefix, sys.base_prefix, "/usr", *glob.glob("/lib*")}
        runtime.add(os.path.dirname(os.path.realpath(sys.executable)))
        return L.build_plan(
            runtime_paths=sorted(runtime),
            input_dir=str(self.inputs),
            work_dir=str(self.work),
            tmp_dir=str(self.tmp),
            control_dir=str(self.control),
            abi=ABI,
            **kw,  # type: ignore[arg-type]
        )

    def run(
        self,
        code: str,
        *args: str,
        plan_text: str | None = None,
        mode: str = "python",
        target: Sequence[str] | None = None,
        pass_fds: Sequence[int] = (),
        prefix: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        plan_path = self.control / "plan.json"
        plan_path.write_text(plan_text if plan_text is not None else self.plan().to_json())
        suffix = ".py" if mode == "python" else ".sh"
        script = self.control / f"main{suffix}"
        script.write_text(textwrap.dedent(code))
        if target is None:
            target = [str(script)] if mode == "python" else ["/bin/bash", str(script)]
        cmd = [*prefix, sys.executable, "-I", str(BOOT), str(plan_path), mode, *target, *args]
        return subprocess.run(
            cmd,
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            pass_fds=pass_fds,
        )


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    if ABI is None:
        pytest.skip(f"Landlock not available: {L._probe()[1]}")
    dirs = {name: tmp_path / name for name in ("work", "tmp", "control", "inputs")}
    for d in dirs.values():
        d.mkdir()
    (dirs["inputs"] / "data.csv").write_text("a,b\n1,2\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    return Sandbox(root=tmp_path, secret=secret, **dirs)


def test_filesystem_is_restricted(sandbox: Sandbox) -> None:
    r = sandbox.run(
        f"""
        import os

        def attempt(label, fn):
            try:
                fn()
                print(label, "ok")
            except PermissionError:
                print(label, "denied")

        attempt("etc", lambda: open("/etc/hostname").read())
        attempt("secret", lambda: open({str(sandbox.secret)!r}).read())
        attempt("outside-write", lambda: open({str(sandbox.root / "new")!r}, "w").close())
        attempt("work-write", lambda: open("out.txt", "w").write("x"))
        attempt("work-mkdir", lambda: os.makedirs("sub/dir"))
        attempt("tmp-write", lambda: open({str(sandbox.tmp / "t")!r}, "w").write("x"))
        attempt("input-read", lambda: open({str(sandbox.inputs / "data.csv")!r}).read())
        attempt("input-write", lambda: open({str(sandbox.inputs / "data.csv")!r}, "a").close())
        attempt("control-write", lambda: open({str(sandbox.control / "x")!r}, "w").close())
        attempt("runtime-write", lambda: open({sys.prefix + "/sandcell-x"!r}, "w").close())
        attempt("devnull", lambda: open("/dev/null", "w").write("x"))
        attempt("urandom", lambda: open("/dev/urandom", "rb").read(8))
        attempt("proc", lambda: open("/proc/self/status").read())
        """
    )
    assert r.returncode == 0, r.stderr
    seen = dict(line.split() for line in r.stdout.splitlines())
    assert seen == {
        "etc": "denied",
        "secret": "denied",
        "outside-write": "denied",
        "work-write": "ok",
        "work-mkdir": "ok",
        "tmp-write": "ok",
        "input-read": "ok",
        "input-write": "denied",
        "control-write": "denied",
        "runtime-write": "denied",
        "devnull": "ok",
        "urandom": "ok",
        "proc": "ok",
    }
    assert (sandbox.work / "out.txt").read_text() == "x"
    assert not (sandbox.root / "new").exists()


def test_tcp_is_denied(sandbox: Sandbox) -> None:
    assert ABI is not None
    if ABI < 4:
        pytest.skip(f"TCP rules need Landlock ABI 4, the kernel has {ABI}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        r = sandbox.run(
            f"""
            import socket
            for label, action in (("connect", "connect"), ("bind", "bind")):
                with socket.socket() as s:
                    try:
                        getattr(s, action)(("127.0.0.1", {port} if action == "connect" else 0))
                        print(label, "ok")
                    except PermissionError:
                        print(label, "denied")
            """
        )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["connect", "denied", "bind", "denied"]


def test_tcp_stays_open_when_not_denied(sandbox: Sandbox) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        r = sandbox.run(
            f"import socket; socket.create_connection(('127.0.0.1', {port})).close()",
            plan_text=L.boot_plan_json(plan=replace(sandbox.plan(), deny_tcp=False)),
        )
    assert r.returncode == 0, r.stderr


def test_signals_and_abstract_sockets_are_scoped(sandbox: Sandbox) -> None:
    assert ABI is not None
    if ABI < 6:
        pytest.skip(f"IPC scoping needs Landlock ABI 6, the kernel has {ABI}")
    name = f"sandcell-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("\0" + name)
        server.listen(1)
        r = sandbox.run(
            f"""
            import os, signal, socket, subprocess
            try:
                os.kill(os.getppid(), 0)
                print("parent ok")
            except PermissionError:
                print("parent denied")
            # A child is inside the same domain: signalling it works.
            child = subprocess.Popen(["sleep", "30"])
            os.kill(child.pid, signal.SIGKILL)
            print("child", child.wait())
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect("\\0{name}")
                    print("abstract ok")
                except PermissionError:
                    print("abstract denied")
            """
        )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["parent denied", "child -9", "abstract denied"]


@pytest.mark.parametrize(
    ("code", "status", "stderr_has"),
    [
        ("pass", 0, ""),
        ("import sys; sys.exit(3)", 3, ""),
        ("raise SystemExit('goodbye')", 1, "goodbye"),
        ("import sys; sys.exit(None)", 0, ""),
        ("raise KeyError('k')", 1, "KeyError: 'k'"),
    ],
)
def test_exit_statuses(sandbox: Sandbox, code: str, status: int, stderr_has: str) -> None:
    r = sandbox.run(code)
    assert r.returncode == status, r.stderr
    assert r.stderr.strip().endswith(stderr_has)


def test_uncaught_exception_shows_only_the_program(sandbox: Sandbox) -> None:
    r = sandbox.run(
        """
        def fail():
            raise ValueError("bad value")

        fail()
        """
    )
    assert r.returncode == 1
    main = sandbox.control / "main.py"
    assert r.stderr == (
        "Traceback (most recent call last):\n"
        f'  File "{main}", line 5, in <module>\n'
        "    fail()\n"
        f'  File "{main}", line 3, in fail\n'
        '    raise ValueError("bad value")\n'
        "ValueError: bad value\n"
    )
    assert "boot" not in r.stderr


# With Landlock applied the boot compiles through the C API (ctypes is loaded anyway); without,
# through the builtin compile(): both paths must look the same to the program.
both_compilers = pytest.mark.parametrize("landlocked", [True, False], ids=["capi", "builtin"])


def _plan_text(sandbox: Sandbox, landlocked: bool) -> str:
    return sandbox.plan().to_json() if landlocked else L.boot_plan_json(plan=None)


@both_compilers
def test_syntax_error_is_reported_like_the_interpreter(sandbox: Sandbox, landlocked: bool) -> None:
    r = sandbox.run("x = (\n", plan_text=_plan_text(sandbox, landlocked))
    plain = subprocess.run(
        [sys.executable, "-I", str(sandbox.control / "main.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == plain.returncode == 1
    assert r.stderr == plain.stderr
    assert "SyntaxError" in r.stderr and "Traceback" not in r.stderr


@both_compilers
def test_the_program_sees_a_normal_main(sandbox: Sandbox, landlocked: bool) -> None:
    r = sandbox.run(
        '''
        """The docstring."""
        import json, sys
        def f(x: int) -> None: ...
        print(json.dumps({
            "argv": sys.argv,
            "orig_argv": sys.orig_argv[1:],
            "name": __name__,
            "file": __file__,
            "doc": __doc__,
            "names": sorted(globals()),
            "main_is_module": sys.modules["__main__"].__dict__ is globals(),
            "annotation": repr(f.__annotations__["x"]),
            "loader": type(__loader__).__name__,
            "spec": __spec__,
            "boot_in_main": "_main" in globals(),
        }))
        if __name__ == "__main__":
            print("guarded")
        ''',
        "one",
        "two words",
        plan_text=_plan_text(sandbox, landlocked),
    )
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    got = json.loads(first)
    main = str(sandbox.control / "main.py")
    assert got["argv"] == [main, "one", "two words"]
    assert got["orig_argv"] == ["-I", main, "one", "two words"]
    assert got["name"] == "__main__"
    assert got["file"] == main
    assert got["doc"] == "The docstring."
    assert got["names"] == sorted(
        [
            "__annotations__", "__builtins__", "__cached__", "__doc__", "__file__",
            "__loader__", "__name__", "__package__", "__spec__", "f", "json", "sys",
        ]
    )  # fmt: skip
    assert got["main_is_module"] is True
    # The boot's `from __future__ import annotations` does not leak into the program.
    assert got["annotation"] == "<class 'int'>"
    assert got["loader"] == "SourceFileLoader"
    assert got["spec"] is None
    assert got["boot_in_main"] is False
    assert second == "guarded"


@both_compilers
@pytest.mark.parametrize(
    "source",
    [
        b"# -*- coding: latin-1 -*-\nprint(ascii('\xe9'))\n",
        b"\xef\xbb\xbfprint(ascii('\xc3\xa9'))\n",
    ],
    ids=["cookie", "bom"],
)
def test_source_encoding_is_honoured(sandbox: Sandbox, landlocked: bool, source: bytes) -> None:
    script = sandbox.work / "enc.py"
    script.write_bytes(source)
    r = sandbox.run("", plan_text=_plan_text(sandbox, landlocked), target=[str(script)])
    assert (r.returncode, r.stdout, r.stderr) == (0, "'\\xe9'\n", "")


@both_compilers
def test_nul_bytes_are_refused(sandbox: Sandbox, landlocked: bool) -> None:
    script = sandbox.work / "nul.py"
    script.write_bytes(b"print('before')\x00print('after')\n")
    r = sandbox.run("", plan_text=_plan_text(sandbox, landlocked), target=[str(script)])
    assert (r.returncode, r.stdout) == (1, "")
    assert "null bytes" in r.stderr


def test_functions_of_main_pickle(sandbox: Sandbox) -> None:
    r = sandbox.run(
        """
        import pickle
        def double(x):
            return 2 * x
        print(pickle.loads(pickle.dumps(double))(21))
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "42"


def test_site_packages_and_multiprocessing_work(sandbox: Sandbox) -> None:
    pytest.importorskip("numpy")
    r = sandbox.run(
        """
        import multiprocessing
        import numpy as np
        print(int(np.arange(10).sum()))
        with multiprocessing.Pool(2) as pool:
            print(pool.map(abs, [-1, -2]))
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["45", "[1, 2]"]


def test_descriptors_are_closed_and_status_is_reported(sandbox: Sandbox) -> None:
    stray_r, stray_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        plan_text = L.boot_plan_json(
            plan=sandbox.plan(),
            status_fd=status_w,
            input_links=[("data.csv", str(sandbox.inputs / "data.csv"))],
        )
        r = sandbox.run(
            """
            import os
            print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
            print(open("data.csv").read().splitlines()[0])
            """,
            plan_text=plan_text,
            pass_fds=(stray_w, status_w),
        )
        os.close(status_w)
        status_w = -1
        # "1": the program is starting; "W<status>": the boot's supervising process reports how
        # it ended. The program itself never held the descriptor (its fd list below).
        assert os.read(status_r, 16) == b"1W0\n"
        assert os.read(status_r, 16) == b""
    finally:
        for fd in (stray_r, stray_w, status_r, status_w):
            if fd >= 0:
                os.close(fd)
    assert r.returncode == 0, r.stderr
    fds, first_line = r.stdout.splitlines()
    assert fds == "[0, 1, 2, 3]"  # stdio and the descriptor of the listing itself
    assert first_line == "a,b"
    assert (sandbox.work / "data.csv").is_symlink()


def test_a_supervised_boot_runs_the_program_in_its_own_process(sandbox: Sandbox) -> None:
    # With a pid 1 above it (the native init) the boot forks nothing: the program runs in the
    # boot's process, which writes "1" and closes the descriptor; the status is the init's.
    status_r, status_w = os.pipe()
    try:
        plan_text = L.boot_plan_json(plan=sandbox.plan(), status_fd=status_w, supervised=True)
        r = sandbox.run(
            """
            import os
            print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
            print(os.getppid())
            """,
            plan_text=plan_text,
            pass_fds=(status_w,),
        )
        os.close(status_w)
        status_w = -1
        assert os.read(status_r, 16) == b"1"
        assert os.read(status_r, 16) == b""
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
    assert r.returncode == 0, r.stderr
    fds, parent = r.stdout.splitlines()
    assert fds == "[0, 1, 2, 3]"
    assert int(parent) == os.getpid(), "the boot forked: the program's parent is not its caller"


def test_descriptors_above_the_open_files_limit_are_closed(sandbox: Sandbox) -> None:
    r_fd, w_fd = os.pipe()
    high = os.dup2(w_fd, 1000, inheritable=False)
    try:
        r = sandbox.run(
            "import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))",
            pass_fds=(high,),
            # The launcher lowers RLIMIT_NOFILE before the boot; a descriptor above it stays open.
            prefix=["bash", "-c", 'ulimit -n 64 && exec "$@"', "limit"],
        )
    finally:
        for fd in (r_fd, w_fd, high):
            os.close(fd)
    assert (r.returncode, r.stdout) == (0, "[0, 1, 2, 3]\n"), r.stderr


def test_missing_paths_are_skipped(sandbox: Sandbox) -> None:
    plan = sandbox.plan()
    plan = L.LandlockPlan(
        read_exec=(*plan.read_exec, "/nonexistent/sandcell"),
        read_only=plan.read_only,
        read_write=plan.read_write,
        abi=plan.abi,
    )
    assert sandbox.run("print('ran')", plan_text=plan.to_json()).stdout == "ran\n"


def _broken_plan(sandbox: Sandbox, *, required: bool) -> str:
    doc = json.loads(sandbox.plan(required=required).to_json())
    # A right the ruleset does not handle: the kernel refuses the rule with EINVAL.
    doc["landlock"]["ruleset"]["rules"][0][1] |= 1 << 40
    return json.dumps(doc)


def test_required_landlock_failure_stops_the_run(sandbox: Sandbox) -> None:
    r = sandbox.run("print('ran')", plan_text=_broken_plan(sandbox, required=True))
    assert r.returncode == L.BOOT_FAILED_STATUS
    assert r.stdout == ""
    assert r.stderr.startswith("sandcell-boot: landlock: ")
    assert "landlock_add_rule" in r.stderr


def test_optional_landlock_failure_warns_and_runs(sandbox: Sandbox) -> None:
    r = sandbox.run(
        f"print(open({str(sandbox.secret)!r}).read())",
        plan_text=_broken_plan(sandbox, required=False),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "host secret\n"
    assert "running without it" in r.stderr


def test_no_landlock_section_runs_unrestricted(sandbox: Sandbox) -> None:
    r = sandbox.run(
        f"print(open({str(sandbox.secret)!r}).read())", plan_text=L.boot_plan_json(plan=None)
    )
    assert (r.returncode, r.stdout) == (0, "host secret\n")


@pytest.mark.parametrize("plan_text", ["", "{", '{"format": 99}', "[1]"])
def test_unreadable_plan_stops_the_run(sandbox: Sandbox, plan_text: str) -> None:
    r = sandbox.run("print('ran')", plan_text=plan_text)
    assert r.returncode == L.BOOT_FAILED_STATUS
    assert r.stderr.startswith("sandcell-boot: cannot read the plan")


def test_usage_error(sandbox: Sandbox) -> None:
    r = sandbox.run("pass", mode="spawn", target=["x"])
    assert r.returncode == L.BOOT_FAILED_STATUS
    assert "usage" in r.stderr


def test_missing_script(sandbox: Sandbox) -> None:
    r = sandbox.run("pass", target=[str(sandbox.control / "nope.py")])
    assert r.returncode == 2
    assert "can't open file" in r.stderr


def test_exec_mode_runs_bash_under_the_same_rules(sandbox: Sandbox) -> None:
    if not os.path.exists("/bin/bash"):
        pytest.skip("no /bin/bash")
    stray_r, stray_w = os.pipe()
    try:
        r = sandbox.run(
            f"""
            echo "args: $1 $2"
            cat /etc/hostname >/dev/null 2>&1 && echo "etc ok" || echo "etc denied"
            cat {sandbox.secret} >/dev/null 2>&1 && echo "secret ok" || echo "secret denied"
            echo hello > out.txt && echo "work ok"
            [ -e /proc/$$/fd/{stray_w} ] && echo "stray open" || echo "stray closed"
            echo "to stderr" > /dev/stderr
            exit 7
            """,
            "a",
            "b",
            mode="exec",
            pass_fds=(stray_w,),
        )
    finally:
        os.close(stray_r)
        os.close(stray_w)
    assert r.returncode == 7, r.stderr
    assert r.stdout.splitlines() == [
        "args: a b",
        "etc denied",
        "secret denied",
        "work ok",
        "stray closed",
    ]
    assert r.stderr == "to stderr\n"
    assert (sandbox.work / "out.txt").read_text() == "hello\n"


def test_exec_of_a_missing_program(sandbox: Sandbox) -> None:
    r = sandbox.run("", mode="exec", target=["/nonexistent/program"])
    assert r.returncode == 127
    assert r.stderr.startswith("sandcell-boot: exec /nonexistent/program")


@needs_landlock
def test_boot_runs_with_no_site(tmp_path: Path) -> None:
    # -S works too (the host uses -I only, so that site-packages are importable).
    work = tmp_path / "work"
    work.mkdir()
    script = work / "m.py"
    script.write_text("import sys; print('site' in sys.modules)")
    runtime = sorted({sys.prefix, sys.base_prefix, "/usr", *glob.glob("/lib*")})
    assert ABI is not None
    plan = L.build_plan(runtime_paths=runtime, input_dir=None, work_dir=str(work), abi=ABI)
    (tmp_path / "plan.json").write_text(plan.to_json())
    r = subprocess.run(
        [sys.executable, "-I", "-S", str(BOOT), str(tmp_path / "plan.json"), "python", str(script)],
        capture_output=True,
        text=True,
        check=False,
        cwd=work,
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "False\n", "")
