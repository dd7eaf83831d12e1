"""A real, throwaway PostgreSQL server for tests: one cluster in a temporary directory.

The shared-state store (``SANDCELL_DATABASE_URL=postgresql://...``) is tested against the real
thing, so this starts Debian's ``postgres`` binaries, not a fake. The cluster listens on
127.0.0.1 on a free port (kept across restarts: the failure tests restart PostgreSQL under load
and the clients must find it again at the same address) and on a unix socket in its directory.

PostgreSQL refuses to run as root, so when the tests run as root the cluster belongs to the
ordinary test user (``SANDCELL_TEST_USER``, default ``sandcell-test``) and every server program
runs through ``runuser``. Flushing to disk is switched off (``fsync``, ``full_page_writes``): a
test cluster never outlives its test session, and a crash test (``stop("immediate")``) still
exercises WAL recovery, which needs the WAL written to the OS, not flushed to the disk.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

import psycopg
from psycopg import sql

TEST_USER = os.environ.get("SANDCELL_TEST_USER", "sandcell-test")
SUPERUSER = "postgres"
"""The cluster's superuser (trust authentication: any local client may be it)."""
READY_TIMEOUT_S = 300
"""How long a start or stop may take before it counts as failed: minutes, because a loaded
2-core CI machine can be slow, and ``pg_ctl -w`` returns as soon as the server is ready."""
_SEARCH_DIRS = (Path("/usr/lib/postgresql"),)
_FALLBACK_DIRS = (Path("/usr/local/bin"), Path("/usr/bin"))
_NEEDED = ("initdb", "pg_ctl", "postgres")
_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""The server programs' PATH (runuser is in /usr/sbin, not on every user's PATH)."""
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

StopMode = Literal["smart", "fast", "immediate"]


class PostgresServerError(RuntimeError):
    """The test cluster could not be created, started or stopped (the message has its log)."""


def find_bin_dir() -> Path | None:
    """The directory of the newest installed PostgreSQL server programs, or None.

    Debian installs each major version under ``/usr/lib/postgresql/<ver>/bin`` (not on PATH);
    other installs put ``initdb`` and ``pg_ctl`` on PATH (``/usr/local/bin`` here links them).
    ``SANDCELL_PG_BIN`` names a directory explicitly.
    """
    explicit = os.environ.get("SANDCELL_PG_BIN")
    if explicit:
        path = Path(explicit)
        return path if _has_server(path) else None
    versions: list[tuple[tuple[int, ...], Path]] = []
    for root in _SEARCH_DIRS:
        if not root.is_dir():
            continue
        for entry in root.iterdir():
            bindir = entry / "bin"
            numbers = tuple(int(p) for p in re.findall(r"\d+", entry.name))
            if numbers and _has_server(bindir):
                versions.append((numbers, bindir))
    if versions:
        return max(versions)[1]
    for bindir in _FALLBACK_DIRS:
        if _has_server(bindir):
            return Path(os.path.realpath(bindir / "pg_ctl")).parent
    return None


def _has_server(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in _NEEDED)


def unavailable_reason() -> str | None:
    """Why this host cannot run a test cluster, or None when it can."""
    if find_bin_dir() is None:
        explicit = os.environ.get("SANDCELL_PG_BIN")
        if explicit:
            return f"SANDCELL_PG_BIN={explicit} lacks initdb, pg_ctl or postgres"
        return (
            "no PostgreSQL server programs (initdb, pg_ctl, postgres) under /usr/lib/postgresql/"
            "*/bin or on PATH; install them: apt-get install postgresql"
        )
    if os.geteuid() == 0:
        if shutil.which("runuser", path=_SYSTEM_PATH) is None:
            return "running PostgreSQL as root needs runuser (util-linux) to switch users"
        try:
            pwd.getpwnam(TEST_USER)
        except KeyError:
            return (
                f"PostgreSQL will not run as root and user {TEST_USER} does not exist; "
                f"create it: useradd -m {TEST_USER}"
            )
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, owned by this object.

    ``start()`` creates the cluster on first use (``initdb``), then starts it and returns once it
    accepts connections. ``close()`` stops it and removes the directory; the object is also a
    context manager. Databases are made with ``create_database`` (a copy of ``template0``: empty,
    and fast because nothing ever connects to the template).
    """

    def __init__(self, base_dir: Path | None = None) -> None:
        self._bindir = find_bin_dir()
        if self._bindir is None:
            raise PostgresServerError(unavailable_reason() or "no PostgreSQL server programs")
        self._as_user = TEST_USER if os.geteuid() == 0 else None
        self._runuser = shutil.which("runuser", path=_SYSTEM_PATH) or "runuser"
        self.base = Path(tempfile.mkdtemp(prefix="sandcell-pg-", dir=base_dir))
        # The cluster's user must reach its directory; the base is made directly under /tmp (or
        # base_dir) because pytest's own temporary directories are private to root.
        if self._as_user is not None:
            shutil.chown(self.base, self._as_user, self._as_user)
        self.base.chmod(0o700)
        self.data = self.base / "data"
        self.socket_dir = self.base / "sock"
        self.log = self.base / "server.log"
        self.port = 0
        self._initialized = False

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server (creating the cluster first if needed); return when it is ready."""
        if not self._initialized:
            self._initdb()
        if self.port == 0:
            # A free port now may be taken by someone else before postgres binds it: try again on
            # another. After the first start the port is fixed (restarts must keep it).
            for attempt in range(5):
                self.port = _free_port()
                try:
                    self._pg_ctl_start()
                    return
                except PostgresServerError:
                    if attempt == 4 or "Address already in use" not in self._log_text():
                        raise
            return
        self._pg_ctl_start()

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server: ``fast`` (clients disconnected, clean shutdown) or ``immediate``
        (every process killed, as in a crash: the next start recovers from the WAL)."""
        self._run(
            [self._bin("pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w",
             "-t", str(READY_TIMEOUT_S)],
            what=f"stop ({mode})",
        )  # fmt: skip

    def restart(self, mode: StopMode = "fast") -> None:
        """Stop and start again on the same port, with the same data."""
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        proc = self._run([self._bin("pg_ctl"), "status", "-D", str(self.data)], check=False)
        return proc.returncode == 0

    def close(self) -> None:
        """Stop the server however it can be stopped and remove its directory."""
        if self.data.is_dir() and self.is_running():
            with contextlib.suppress(PostgresServerError):
                self.stop("immediate")
        self._kill_leftovers()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- addresses and databases ----------------------------------------------------------------

    def url(self, dbname: str = "postgres") -> str:
        """``postgresql://USER@127.0.0.1:PORT/DBNAME`` (TCP on loopback, as a service connects)."""
        if self.port == 0:
            raise PostgresServerError("the server was never started: it has no port yet")
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def socket_url(self, dbname: str = "postgres") -> str:
        """The same database over the unix socket in the server's directory."""
        return f"postgresql://{SUPERUSER}@/{dbname}?host={self.socket_dir}&port={self.port}"

    def create_database(self, name: str, *, template: str = "template0") -> str:
        """Create database ``name`` as a copy of ``template`` (by default ``template0``: empty)
        and return its URL. Nobody may be connected to ``template`` meanwhile."""
        self._admin(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                self._ident(name), self._ident(template)
            )
        )
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, disconnecting whoever is still connected."""
        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(self._ident(name)))

    # --- internals -------------------------------------------------------------------------------

    @staticmethod
    def _ident(name: str) -> sql.Identifier:
        # Test database names are plain identifiers; anything else is a bug in the test.
        if not _DB_NAME.fullmatch(name):
            raise ValueError(f"database name {name!r}: use [a-z_][a-z0-9_]*, at most 63 chars")
        return sql.Identifier(name)

    def _admin(self, statement: sql.Composed) -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=60) as conn:
            conn.execute(statement)

    def _bin(self, name: str) -> str:
        assert self._bindir is not None
        return str(self._bindir / name)

    def _run(
        self, args: list[str], *, what: str = "", check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        prefix = [] if self._as_user is None else [self._runuser, "-u", self._as_user, "--"]
        # The cluster's user may not read the caller's working directory or HOME: both are the
        # cluster's own directory. LC_ALL=C: initdb takes the locale from the environment.
        env = {
            "PATH": _SYSTEM_PATH,
            "HOME": str(self.base),
            "LC_ALL": "C",
            "TZ": "UTC",
        }
        proc = subprocess.run(
            [*prefix, *args],
            cwd=self.base,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=READY_TIMEOUT_S + 60,
        )
        if check and proc.returncode != 0:
            raise PostgresServerError(
                f"PostgreSQL {what or args[0]} failed ({proc.returncode}): "
                f"{proc.stdout.strip()} {proc.stderr.strip()}\n--- server log ---\n"
                f"{self._log_text()[-4000:]}"
            )
        return proc

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def _initdb(self) -> None:
        self._run(
            [self._bin("initdb"), "-D", str(self.data), "--auth=trust", f"--username={SUPERUSER}",
             "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"],
            what="initdb",
        )  # fmt: skip
        self._run(["mkdir", "-m", "700", str(self.socket_dir)], what="mkdir")
        settings = {
            # Loopback only (the tests' network rule) and a socket of its own: no clash with a
            # system cluster on /var/run/postgresql.
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.socket_dir}'",
            # Throwaway data: no flush to disk, so starts, CREATE DATABASE and commits are fast.
            # fsync off still writes every commit to the OS before answering, so an immediate
            # stop (a crash of PostgreSQL, not of the machine) loses nothing acknowledged.
            # synchronous_commit stays on: off would answer commits still in shared memory,
            # and the crash tests would see a commit vanish that real PostgreSQL keeps.
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
            "max_wal_size": "256MB",
            # The log goes to the file pg_ctl -l names; its line prefix shows which test's pid.
            "logging_collector": "off",
            "log_line_prefix": "'%m [%p] %d '",
        }
        conf = "".join(f"{key} = {value}\n" for key, value in settings.items())
        # postgresql.conf belongs to the cluster's user: append through a root-written include.
        extra = self.base / "test.conf"
        extra.write_text(conf)
        extra.chmod(0o644)
        self._run(
            ["sh", "-c", f"echo \"include '{extra}'\" >> '{self.data}/postgresql.conf'"],
            what="configure",
        )
        self._initialized = True

    def _pg_ctl_start(self) -> None:
        # -w: pg_ctl returns once the server accepts connections (it reads postmaster.pid's
        # status line), within -t seconds; no fixed sleep.
        self._run(
            [self._bin("pg_ctl"), "start", "-D", str(self.data), "-l", str(self.log), "-w",
             "-t", str(READY_TIMEOUT_S), "-o", f"-p {self.port}"],
            what="start",
        )  # fmt: skip

    def _kill_leftovers(self) -> None:
        """Kill the postmaster if it outlived the stop; its children exit when it is gone."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return
        # A stale pid file may name a pid reused since: kill only this cluster's postmaster.
        if str(self.data).encode() not in _cmdline(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its parent to reap it has finished)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
