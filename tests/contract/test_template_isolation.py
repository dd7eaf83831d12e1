"""Runs started from the same template cannot see or affect each other, or the template.

Each test lets a first run change, leave behind or corrupt something, then checks from a second
run (and from the host) that nothing of it is there: the second run sees the pristine template
state. Both warm modes, as root through the in-process executor (the CLI starts a template per
invocation, so only the in-process executor serves many runs from one template). The template's
pid and its sys.modules digest are the same before and after, and it never ran the code: it
only forks.
"""

from __future__ import annotations

import json
import os
import secrets
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pandas
import pytest
from tests.escapes.conftest import processes_with

from sandcell import Executor, Limits, RunRequest, input_from_path, result_to_dict
from sandcell.backends.namespaces import NamespacesBackend


@pytest.fixture(params=["template", "pool"])
def warm(request: pytest.FixtureRequest) -> Iterator[Executor]:
    ex: Executor = request.getfixturevalue(f"executor_{request.param}")
    yield ex


def _run(ex: Executor, code: str, **kw: Any) -> dict[str, Any]:
    r = result_to_dict(ex.run(RunRequest(code=textwrap.dedent(code).strip() + "\n", **kw)))
    start = cast(dict[str, Any], r["start"])
    assert start["mode"] in ("template", "pool"), r
    return cast(dict[str, Any], r)


def _seen(r: dict[str, Any]) -> Any:
    assert r["outcome"] == "ok", r
    return json.loads(str(r["stdout"]).strip().splitlines()[-1])


def _backend(ex: Executor) -> NamespacesBackend:
    backend = ex.backend
    assert isinstance(backend, NamespacesBackend)
    return backend


def _template_state(ex: Executor) -> tuple[int | None, str]:
    stats = _backend(ex).warm_stats()
    assert stats is not None
    state = dict(stats.template_state)
    assert state.get("threads") == 1, state
    return stats.template_pid, str(state.get("modules_sha256"))


def test_globals_and_monkeypatches_stay_in_their_run(warm: Executor) -> None:
    before = _template_state(warm)
    first = _run(
        warm,
        """
        import builtins, json, os, random, sys
        import numpy as np
        import pandas as pd
        builtins.LEAKED = "from the first run"
        pd.DataFrame.sum = None
        np.random.seed(1234)
        random.seed(1234)
        sys.modules["json"] = None
        sys.path.insert(0, "/evil")
        sys.setrecursionlimit(60)
        os.environ["LEAKED"] = "1"
        print("{}")
        """,
    )
    assert first["outcome"] == "ok", first
    second = _seen(
        _run(
            warm,
            """
            import builtins, json, os, random, sys
            import numpy as np
            import pandas as pd
            print(json.dumps({
                "builtin": hasattr(builtins, "LEAKED"),
                "sum": callable(pd.DataFrame.sum),
                "total": int(pd.DataFrame({"a": [1, 2, 3]}).sum()["a"]),
                "evil": "/evil" in sys.path,
                "recursion": sys.getrecursionlimit(),
                "env": "LEAKED" in os.environ,
                "np_seeded": float(np.random.RandomState(1234).random_sample())
                == float(np.random.random_sample()),
                "py_seeded": random.Random(1234).random() == random.random(),
            }))
            """,
        )
    )
    assert second == {
        "builtin": False,
        "sum": True,
        "total": 6,
        "evil": False,
        "recursion": 1000,
        "env": False,
        "np_seeded": False,
        "py_seeded": False,
    }
    assert _template_state(warm) == before


def test_the_program_environment_is_its_request_s(warm: Executor) -> None:
    """A usual run keeps the environment the template settled on (nothing to change), one with
    variables of its own replaces it: both see exactly what their request says, in os.environ
    and in the process's own environment, and none of the template's preload settings."""
    from sandcell.backends.namespaces.template import PRELOAD_ONLY, THREAD_ENV

    # The C library's environ, which getenv in the program's libraries and its children read
    # (/proc/self/environ shows only the block the template's exec started with).
    code = """
        import ctypes, json, os
        environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
        raw, i = [], 0
        while environ[i]:
            raw.append(environ[i].decode().split("=", 1))
            i += 1
        print(json.dumps([dict(os.environ), dict(raw)]))
        """
    usual, usual_raw = _seen(_run(warm, code))
    own, own_raw = _seen(_run(warm, code, env={"RUN_OWN": "1", "HOME": "/sandbox"}))
    again, _ = _seen(_run(warm, code))
    assert usual == usual_raw and own == own_raw
    assert own == {**usual, "RUN_OWN": "1", "HOME": "/sandbox"}
    assert again == usual
    for name in (*THREAD_ENV, "PWD", PRELOAD_ONLY):
        assert name not in usual


def test_random_state_differs_between_runs(warm: Executor) -> None:
    code = """
    import json, random
    import numpy as np
    print(json.dumps([random.random(), float(np.random.random_sample())]))
    """
    a, b = _seen(_run(warm, code)), _seen(_run(warm, code))
    assert a[0] != b[0] and a[1] != b[1], (a, b)


def test_files_stay_in_their_run(warm: Executor) -> None:
    listing = """
        import json, os
        print(json.dumps({d: sorted(os.listdir(d)) for d in ("/sandbox", "/tmp", "/dev/shm")}))
        """
    # What a fresh run sees: empty, but for the directories above runtime mounts that live
    # under /tmp (a checkout's venv there), as in a cold run.
    fresh = _seen(_run(warm, listing))
    assert fresh["/sandbox"] == [] and fresh["/dev/shm"] == []
    first = _run(
        warm,
        """
        for path in ("/sandbox/left.txt", "/tmp/left.txt", "/dev/shm/left"):
            with open(path, "w") as f:
                f.write("x")
        print("{}")
        """,
    )
    assert first["outcome"] == "ok", first
    assert _seen(_run(warm, listing)) == fresh


def test_threads_and_background_processes_end_with_their_run(
    warm: Executor, tmp_path: Path
) -> None:
    """A thread and a background process of one run are gone after it. The background process
    is first seen alive by the host, which then opens a gate the program waits on."""
    token = f"sandcell-iso-{secrets.token_hex(6)}"
    gate = tmp_path / "gate"
    gate.mkdir()
    # The gate is a file's content, not a name the host creates later: an input directory shows
    # the names it had when the run first looked them up (neutral_sources.py).
    (gate / "seen").write_text("")
    code = f"""
        import os, threading, time
        def linger():
            time.sleep(30)
            open("/tmp/from-thread", "w").write("x")
        threading.Thread(target=linger, daemon=True).start()
        if os.fork() == 0:
            os.setsid()
            os.execv("/bin/sleep", ["{token}", "60"])
        for _ in range(3000):
            if open("/inputs/gate/seen").read():
                break
            time.sleep(0.02)
        print("{{}}")
        """
    box: dict[str, dict[str, Any]] = {}
    thread = threading.Thread(
        target=lambda: box.setdefault("r", _run(warm, code, inputs=(input_from_path(gate),)))
    )
    thread.start()
    seen = False
    while thread.is_alive():
        # argv[0] is the token: the sleeper itself, not a command line that mentions it.
        if not seen and any(p.split(": ", 1)[1].startswith(token) for p in processes_with(token)):
            seen = True
            (gate / "seen").write_text("seen")
        thread.join(0.02)
    first = box["r"]
    assert first["outcome"] == "ok", first
    assert seen, "the host never saw the background process alive"
    deadline = time.monotonic() + 5
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_with(token), "a background process outlived its run"
    seen = _seen(
        _run(
            warm,
            """
            import json, os
            pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            print(json.dumps({"pids": pids, "threads": len(os.listdir("/proc/self/task"))}))
            """,
        )
    )
    # pid 1 (the run's supervisor) and this program: nothing of the first run, one thread.
    assert len(seen["pids"]) == 2 and seen["threads"] == 1, seen


def test_memory_corruption_stays_in_its_run(warm: Executor) -> None:
    first = _run(
        warm,
        """
        import ctypes, sys
        import pandas as pd
        # Overwrite the characters of a string the template created, and the value of a cached
        # small integer: both live in pages the run shares with the template until written.
        version = pd.__version__
        ctypes.memset(id(version) + sys.getsizeof("") - 1, ord("X"), len(version))
        ctypes.c_long.from_address(id(7) + 24).value = 8
        print("{}")
        """,
    )
    assert first["outcome"] in ("ok", "error", "killed"), first
    seen = _seen(
        _run(
            warm,
            """
            import json
            import pandas as pd
            n = 3
            print(json.dumps({"version": pd.__version__, "seven": n + 4 == 7}))
            """,
        )
    )
    assert seen == {"version": pandas.__version__, "seven": True}


def test_cwd_umask_and_rlimits_stay_in_their_run(warm: Executor) -> None:
    first = _run(
        warm,
        """
        import os, resource
        os.chdir("/tmp")
        os.umask(0o777)
        resource.setrlimit(resource.RLIMIT_NOFILE, (12, 12))
        print("{}")
        """,
    )
    assert first["outcome"] == "ok", first
    seen = _seen(
        _run(
            warm,
            """
            import json, os, resource
            mask = os.umask(0o022)
            print(json.dumps({"cwd": os.getcwd(), "umask": mask,
                              "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
            """,
        )
    )
    assert seen == {"cwd": "/sandbox", "umask": 0o022, "nofile": 256}


def test_signals_and_tracing_reach_neither_template_nor_siblings(warm: Executor) -> None:
    before = _template_state(warm)
    pid = before[0]
    assert pid is not None
    r = _run(
        warm,
        f"""
        import ctypes, errno, json, os, signal
        libc = ctypes.CDLL(None, use_errno=True)
        seen = {{}}
        for name, fn in (
            ("kill_template", lambda: os.kill({pid}, signal.SIGKILL)),
            ("ptrace_template", lambda: libc.ptrace(16, {pid}, None, None)),
        ):
            try:
                res = fn()
                seen[name] = res if res is None else (res, ctypes.get_errno())
            except OSError as exc:
                seen[name] = exc.errno
        try:
            os.kill(-1, signal.SIGKILL)  # everything this run may signal: its own pid namespace
        except OSError as exc:
            seen["kill_all"] = exc.errno
        print(json.dumps(seen), flush=True)
        """,
    )
    seen = _seen(r)
    assert seen["kill_template"] in (3, 1), seen  # ESRCH or EPERM
    assert seen["ptrace_template"] == [-1, 1], seen  # EPERM (seccomp)
    assert _template_state(warm) == before
    # The pool's siblings and the template still serve runs.
    for _ in range(2):
        assert _run(warm, "print('{}')")["outcome"] == "ok"


def test_loopback_listener_and_abstract_socket_stay_in_their_run(warm: Executor) -> None:
    """Without Landlock (which refuses TCP binds and scopes abstract sockets on its own), so that
    only the run's own network namespace stands between the two runs."""
    name = f"sandcell-iso-{secrets.token_hex(6)}"
    first = _run(
        warm,
        f"""
        import os, socket, time
        tcp = socket.socket()
        tcp.bind(("127.0.0.1", 47211))
        tcp.listen()
        unix = socket.socket(socket.AF_UNIX)
        unix.bind("\\0{name}")
        unix.listen()
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        print("{{}}")
        """,
        landlock=False,
    )
    assert first["outcome"] == "ok", first
    seen = _seen(
        _run(
            warm,
            f"""
            import json, socket
            out = {{}}
            for key, family, address in (
                ("tcp", socket.AF_INET, ("127.0.0.1", 47211)),
                ("abstract", socket.AF_UNIX, "\\0{name}"),
            ):
                s = socket.socket(family)
                s.settimeout(2)
                try:
                    s.connect(address)
                    out[key] = "connected"
                except OSError as exc:
                    out[key] = exc.errno
            print(json.dumps(out))
            """,
            landlock=False,
        )
    )
    assert seen == {"tcp": 111, "abstract": 111}, seen  # ECONNREFUSED


def test_sysv_shared_memory_stays_in_its_run(warm: Executor) -> None:
    key = 0x5C0000 + secrets.randbelow(0xFFFF)
    first = _run(
        warm,
        f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        shm = libc.shmget({key}, 4096, 0o1666)  # IPC_CREAT | 0666
        assert shm >= 0, ctypes.get_errno()
        print("{{}}")
        """,
    )
    assert first["outcome"] == "ok", first
    seen = _seen(
        _run(
            warm,
            f"""
            import ctypes, json
            libc = ctypes.CDLL(None, use_errno=True)
            r = libc.shmget({key}, 0, 0)
            print(json.dumps([r, ctypes.get_errno()]))
            """,
        )
    )
    assert seen == [-1, 2], seen  # ENOENT: a fresh IPC namespace


def test_template_is_unchanged_and_single_threaded(warm: Executor) -> None:
    before = _template_state(warm)
    for _ in range(3):
        _run(warm, "import pandas, threading; threading.Thread(target=print).start()")
    assert _template_state(warm) == before
    stats = _backend(warm).warm_stats()
    assert stats is not None and stats.template_pid is not None
    # The template is the zygote, not an interpreter that ran a program.
    with open(f"/proc/{stats.template_pid}/cmdline", "rb") as f:
        assert b"/sandcell/zygote.pyc" in f.read()
    if stats.pool is not None:
        assert stats.pool.size >= 1 and stats.pool.taken >= 3


def test_cold_fallback_is_recorded(warm: Executor) -> None:
    r = result_to_dict(warm.run(RunRequest(code="echo hi", language="bash")))
    assert r["outcome"] == "ok", r
    assert cast(dict[str, Any], r["start"])["mode"] == "cold"
    layers = cast(dict[str, Any], r["enforcement"])["layers"]
    assert layers["warm_start"].startswith("not used: bash programs start cold"), layers


def test_host_pid_namespace_is_untouched(warm: Executor) -> None:
    """A sanity check of the observers: this process is alive and the template is not ours."""
    stats = _backend(warm).warm_stats()
    assert stats is not None
    assert stats.template_pid != os.getpid()


def test_cancel_all_stops_a_warm_run(warm: Executor) -> None:
    """``cancel_all`` reaches warm runs too: the run ends ``killed`` with the reason given."""
    import threading

    backend = _backend(warm)
    results: list[dict[str, Any]] = []
    runner = threading.Thread(
        target=lambda: results.append(
            _run(warm, "import time\nprint('up', flush=True)\ntime.sleep(120)")
        )
    )
    runner.start()
    deadline = time.monotonic() + 60
    while not backend.runs.in_flight() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.cancel_all("test shutdown") >= 1
    runner.join(timeout=60)
    assert results, "the cancelled run did not return"
    r = results[0]
    assert r["outcome"] == "killed" and str(r["reason"]).startswith("cancelled: test shutdown"), r


def test_pooled_runs_of_other_limits_and_layers(warm: Executor) -> None:
    """A pooled sandbox prepared for one set of limits serves another (its cgroup is retuned),
    and a run without Landlock gets a child forked for it, never a prepared one."""
    small = Limits().with_(memory_bytes=96 * 1024 * 1024, max_pids=16)
    code = "x = bytearray(160 * 1024 * 1024); print(len(x))"
    r = _run(warm, code, limits=small)
    assert r["outcome"] == "memory_limit", r
    r = _run(warm, "print(sum(range(10)))", limits=Limits())
    assert _seen(r) == 45
    r = _run(warm, "print('free')", landlock=False)
    assert r["outcome"] == "ok", r
    assert cast(dict[str, Any], r["start"])["mode"] == "template"
    assert "landlock" not in cast(dict[str, Any], r["enforcement"])["layers"]


@pytest.mark.parametrize("mode", ["template", "pool"])
def test_torn_down_off_the_call_path_yet_nothing_left(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Used sandboxes are destroyed after their results return; once the executor is closed
    no process, cgroup, mount or run directory of any of them is left."""
    from tests.integration.hostscan import cgroups_of
    from tests.integration.test_leaks import _assert_clean

    from sandcell import WarmConfig
    from sandcell.backends.host import workspace

    runs = tmp_path / "runs"
    monkeypatch.setenv("SANDCELL_RUNS", str(runs))
    marker = f"sandcell-leak-{secrets.token_hex(8)}"
    warm = WarmConfig(mode=mode, preload=(), pool_size=2)  # type: ignore[arg-type]
    run_ids: list[str] = []
    with Executor(home=tmp_path / "home", profile="unchecked", warm=warm) as ex:
        # Each program shows its process (and the second its child) alive before it ends. The
        # child carries the marker as argv[0] (``sleep 600 MARKER`` would exit at once: sleep
        # refuses the extra argument, and a check that nothing is left would then prove nothing).
        started_child = (
            "import subprocess, time\n"
            f"p = subprocess.Popen(['{marker}', '600'], executable='/bin/sleep')\n"
            "for _ in range(500):\n"
            f"    if b'{marker}' in open(f'/proc/{{p.pid}}/cmdline', 'rb').read():\n"
            f"        print('{marker} child alive')\n"
            "        break\n"
            "    time.sleep(0.01)\n"
        )
        for code in (
            f"print('{marker}')",
            started_child,
            f"import time; print('{marker}', flush=True); time.sleep(600)",
        ):
            r = ex.run(RunRequest(code=code, limits=Limits().with_(wall_time_s=2)))
            assert r.start.mode == mode and r.outcome.value in ("ok", "timeout"), r
            assert marker in r.stdout, r
            if code is started_child:
                assert f"{marker} child alive" in r.stdout, r
            run_ids.append(r.run_id)
        stats = _backend(ex).warm_stats()
        assert stats is not None
    _assert_clean(runs, marker, None)
    # Only this executor's: the session's warm executors (same owner) keep their pools meanwhile.
    left = [
        g
        for g in cgroups_of(workspace.owner_tag())
        if g.name.startswith(stats.cgroup_prefix) or g.name.endswith(tuple(run_ids))
    ]
    assert not left, f"cgroups left by the warm runs: {left}"


def test_the_program_cannot_interrupt_its_supervisor(warm: Executor) -> None:
    # Without Landlock's signal scoping (off here, and absent before Linux 6.12) the program can
    # signal pid 1; the kernel must drop what pid 1 has no handler for, so its supervisor lives
    # on: the exit status is reported and the exports are read (found by review: Python's own
    # SIGINT handler in pid 1 let a program end its supervisor with KeyboardInterrupt).
    r = _run(
        warm,
        """
        import os, signal
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGALRM):
            os.kill(1, sig)
        with open("out.txt", "w") as f:
            f.write("done")
        print("alive")
        """,
        landlock=False,
        exports=("out.txt",),
    )
    assert r["outcome"] == "ok", r
    assert "alive" in str(r["stdout"])
    assert [a["path"] for a in r["artifacts"]] == ["out.txt"]


def test_a_sigterm_flood_cannot_outlast_the_wall_limit(warm: Executor) -> None:
    # A program flooding pid 1 with SIGTERM ends its own run at once instead of merging the
    # host's stop into its own pending signals (which would hold the run past its wall limit).
    r = _run(
        warm,
        """
        import os, signal
        while True:
            os.kill(1, signal.SIGTERM)
        """,
        landlock=False,
        limits=Limits(wall_time_s=30),
    )
    # Ended by pid 1's kill at the first SIGTERM, long before the wall limit would end it.
    assert r["outcome"] == "killed" and r["signal"] == 9, r
