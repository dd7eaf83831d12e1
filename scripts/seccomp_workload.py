"""A representative workload for the seccomp traces: what Python, numpy, pandas, matplotlib and bash
programs do in a sandbox, run cold, from a warm template and from a pool.

    .venv/bin/python scripts/trace_seccomp.py tests/unit/data/seccomp_trace.txt -- \\
        .venv/bin/python scripts/seccomp_workload.py

The programs touch each family of system calls a sandboxed program plausibly needs: numerics and
plotting, files and directories, links and permissions, pipes and memfds, locks, subprocesses,
threads, multiprocessing (fork, forkserver, spawn), shared memory, loopback sockets (which Landlock
may refuse: the attempt is what counts), asyncio, sqlite, signals and timers, and a bash script
running coreutils. Profile ``unchecked`` so that the checks do not hold the program for approval.
"""

from __future__ import annotations

import sys
from typing import Literal

from sandcell import Executor, Limits, RunRequest, WarmConfig

PYTHON = r"""
import asyncio, concurrent.futures as cf, fcntl, gzip, hashlib, locale, mmap, os, random
import multiprocessing as mp, resource, select, selectors, shutil, signal, socket, sqlite3
import ssl, subprocess, sys, tempfile, threading, time, zlib
from multiprocessing import shared_memory

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def work(x):
    return x * x


def attempt(what, fn):
    try:
        fn()
    except OSError as exc:  # Landlock may refuse sockets: the attempt is what counts
        print("refused", what, exc.errno)


def numerics():
    a = np.random.default_rng(1).normal(size=(300, 300))
    print(float(np.linalg.svd(a)[1][0]))
    df = pd.DataFrame({"x": np.arange(1000), "y": np.random.rand(1000)})
    df.to_csv("/tmp/d.csv")
    print(pd.read_csv("/tmp/d.csv").groupby("x").y.mean().head())
    fig, ax = plt.subplots()
    ax.plot(df.x, df.y)
    for ext in ("png", "svg", "pdf"):
        fig.savefig(f"/tmp/p.{ext}")


def files():
    os.makedirs("/tmp/w/a/b", exist_ok=True)
    with open("/tmp/w/a/f.txt", "w") as f:
        f.write("x" * 10000)
        f.flush()
        os.fsync(f.fileno())
    os.rename("/tmp/w/a/f.txt", "/tmp/w/a/g.txt")
    os.link("/tmp/w/a/g.txt", "/tmp/w/a/h.txt")
    os.symlink("g.txt", "/tmp/w/a/s")
    os.readlink("/tmp/w/a/s")
    os.chmod("/tmp/w/a/g.txt", 0o600)
    os.utime("/tmp/w/a/g.txt")
    os.truncate("/tmp/w/a/g.txt", 10)
    shutil.copy("/tmp/w/a/g.txt", "/tmp/w/c.txt")
    shutil.copytree("/tmp/w/a", "/tmp/w/z")
    shutil.rmtree("/tmp/w/z")
    print(list(os.scandir("/tmp/w")), os.statvfs("/tmp"), os.access("/tmp", os.W_OK))
    print(os.stat("/tmp", follow_symlinks=False), os.getcwd())
    r, w = os.pipe()
    os.write(w, b"hi")
    print(os.read(r, 2))
    os.pipe2(os.O_CLOEXEC)
    os.dup2(r, 50)
    os.close(50)
    os.set_blocking(r, False)
    fd = os.memfd_create("m")
    os.ftruncate(fd, 4096)
    m = mmap.mmap(fd, 4096)
    m[0] = 1
    m.close()
    os.close(fd)
    fcntl.flock(open("/tmp/w/c.txt"), fcntl.LOCK_EX)
    fcntl.lockf(open("/tmp/w/c.txt", "a"), fcntl.LOCK_EX)
    with tempfile.NamedTemporaryFile() as t:
        t.write(b"x")
    with open("/tmp/w/c.txt", "rb") as src, open("/tmp/w/d.txt", "wb") as dst:
        shutil.copyfileobj(src, dst)
        os.copy_file_range(src.fileno(), dst.fileno(), 1, 0, 0)
    db = sqlite3.connect("/tmp/w/db.sqlite")
    db.execute("create table t(x)")
    db.execute("insert into t values (1)")
    db.commit()
    print(db.execute("select * from t").fetchall())
    print(hashlib.sha256(os.urandom(100)).hexdigest()[:8], zlib.crc32(gzip.compress(b"x")))


def process():
    print(os.getpid(), os.getppid(), os.getuid(), os.getgid(), os.geteuid(), os.getgroups())
    print(os.uname(), os.cpu_count(), os.getloadavg(), os.times(), os.sched_getaffinity(0))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print(resource.getrlimit(resource.RLIMIT_NOFILE), os.nice(0))
    shell = "echo hi | tr a-z A-Z; ls / | wc -l; date; sleep 0.01; grep -c . /etc/passwd"
    print(subprocess.run(["bash", "-c", shell], capture_output=True, text=True).stdout)
    subprocess.run([sys.executable, "-c", "print('child')"], check=True)
    p = subprocess.Popen(["sleep", "5"])
    p.send_signal(signal.SIGTERM)
    p.wait()
    os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    os.wait()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    t = threading.Thread(target=time.sleep, args=(0.01,))
    t.start()
    t.join()
    with cf.ThreadPoolExecutor(4) as ex:
        print(sum(ex.map(work, range(100))))
    with mp.Pool(2) as pool:
        print(sum(pool.map(work, range(100))))
    for method in ("forkserver", "spawn"):
        with cf.ProcessPoolExecutor(2, mp_context=mp.get_context(method)) as ex:
            print(sum(ex.map(work, range(10))))
    q = mp.Queue()
    q.put(1)
    print(q.get())
    sm = shared_memory.SharedMemory(create=True, size=1024)
    sm.close()
    sm.unlink()
    signal.signal(signal.SIGALRM, lambda *a: None)
    signal.setitimer(signal.ITIMER_REAL, 0.01)
    time.sleep(0.05)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
    os.kill(os.getpid(), 0)
    print(time.monotonic(), time.process_time(), time.thread_time(), time.strftime("%c"))
    os.eventfd(0)
    os.pidfd_open(os.getpid())
    locale.setlocale(locale.LC_ALL, "")
    ssl.create_default_context()
    print(random.SystemRandom().random() >= 0)


def network():
    def tcp():
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        c = socket.create_connection(srv.getsockname())
        s, _ = srv.accept()
        c.sendall(b"x" * 100)
        print(len(s.recv(100)))
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        c.shutdown(socket.SHUT_RDWR)

    def udp():
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("127.0.0.1", 0))
        u.sendto(b"x", u.getsockname())
        print(u.recvfrom(10))

    attempt("tcp", tcp)
    attempt("udp", udp)
    attempt("ipv6", lambda: socket.socket(socket.AF_INET6).bind(("::1", 0)))
    attempt("resolve", lambda: socket.getaddrinfo("localhost", 80))
    a1, a2 = socket.socketpair()
    a1.send(b"x")
    sel = selectors.DefaultSelector()
    sel.register(a2, selectors.EVENT_READ)
    sel.select(0)
    select.poll().poll(0)
    select.select([a2], [], [], 0)
    a2.recv(1)

    async def tasks():
        await asyncio.sleep(0.01)
        p = await asyncio.create_subprocess_exec("true")
        await p.wait()

    asyncio.run(tasks())


if __name__ == "__main__":
    numerics()
    files()
    process()
    network()
    print("DONE")
"""

BASH = r"""
set -e
x=$(echo sub); echo "$x"; cd /tmp
mkdir -p d/e; touch d/f; ls -la d; cp -r d d2; mv d2 d3; rm -rf d3
ln -s d/f l; readlink l; stat d/f >/dev/null; chmod 600 d/f
printf '%s\n' c b a | sort | uniq | tee /tmp/t.txt | wc -l
head -1 /tmp/t.txt; tail -1 /tmp/t.txt; cut -c1 /tmp/t.txt; tr a b </tmp/t.txt
sed 's/a/z/' /tmp/t.txt; grep -r a /tmp/t.txt; find /tmp -name '*.txt' | xargs -r wc -c
du -sh /tmp >/dev/null; df /tmp >/dev/null; date; id; uname -a; env | sort | head -3
ps aux | head -3; head -2 /proc/self/status
tar czf /tmp/a.tgz -C /tmp d; tar tzf /tmp/a.tgz; gzip -c /tmp/t.txt > /tmp/t.gz; zcat /tmp/t.gz
base64 /tmp/t.txt; sha256sum /tmp/t.txt; od -c /tmp/t.txt | head -2
dd if=/dev/zero of=/tmp/z bs=1k count=10 2>/dev/null
for i in 1 2 3; do echo $i & done; wait; (sleep 0.01; echo bg) & wait
trap 'echo trapped' USR1; kill -USR1 $$; timeout 1 sleep 0.01
read -r line </tmp/t.txt; echo "$line"; exec 3>/tmp/fd3; echo x >&3; exec 3>&-
test -f /tmp/fd3; diff /tmp/t.txt /tmp/t.txt; seq 3 | paste -sd+
python3 -c 'print("python from bash")'; mktemp; nproc; ulimit -a >/dev/null; echo done
"""


def main() -> int:
    limits = Limits(wall_time_s=60, cpu_time_s=60)
    failed = 0
    with Executor(profile="unchecked") as ex:
        programs: tuple[tuple[str, Literal["python", "bash"]], ...] = (
            (PYTHON, "python"),
            (BASH, "bash"),
        )
        for code, language in programs:
            r = ex.run(RunRequest(code=code, language=language, limits=limits))
            print("cold", language, r.outcome.value, r.exit_code)
            failed += r.exit_code != 0
    for mode in ("template", "pool"):
        warm = WarmConfig(mode=mode, preload=("numpy", "pandas"), pool_size=1)
        with Executor(profile="unchecked", warm=warm) as ex:
            r = ex.run(RunRequest(code=PYTHON, limits=limits))
            print(mode, "python", r.outcome.value, r.exit_code)
            failed += r.exit_code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
