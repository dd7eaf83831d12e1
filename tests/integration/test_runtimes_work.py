"""Real data work in the ``datascience`` runtime, on every rung of the ladder and start mode.

One program per case does what a model reaches for first (read an ``.xlsx`` and a Parquet file,
fit a linear regression with statsmodels and scikit-learn, run a t-test, draw a seaborn chart
that comes back as a rich output) and prints JSON that is checked against values computed here
with numpy from the same synthetic data. The Excel and Parquet files are written by a sandboxed
run in the runtime itself (this test environment has neither openpyxl nor pyarrow) from CSV
files made here, and travel in every case's program (see :func:`work_code`).

The cases run as root through an in-process :class:`Executor` (each rung, cold and warm: the
warm template or pool is of the datascience runtime, so the run must start warm) and once as an
ordinary user through ``sandcell run --runtime datascience`` (the rootless path). A tampered
runtime is refused before any sandbox starts.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import (
    UnprivEnv,
    backend_unavailable,
    parse_sandbox_param,
    run_as_user,
    settle_pools,
)

from sandcell import Executor, IsolationMode, RunRequest, input_from_path
from sandcell.backends.warm import WarmConfig
from sandcell.errors import IsolationUnavailable
from sandcell.policy.profiles import Profile, load_profile
from sandcell.runtimes.store import build, find, shipped_lock
from sandcell.runtimes.store.store import forget_verified
from sandcell.spec import Limits, Outcome

RUNTIME = "datascience"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Time: the analysis profile's ceilings (imports are most of a run in this runtime, and slow in
# an emulated microVM on a busy host with two cores). Memory: the default limit (512 MiB; the
# program peaks near 300 MiB), not the profile's 1 GiB: a pooled microVM is sized for the
# default, and a run that asks for more starts cold.
LIMITS = Limits().with_(wall_time_s=120, cpu_time_s=240, memory_bytes=Limits().memory_bytes)

# identity[-backend][-start], as tests/conftest.py's SANDBOX_PARAMS: every rung and start mode
# the suite runs, as root; the rootless path once (the runtime is the same on every rung).
CASES = [
    "root",
    "root-template",
    "root-pool",
    "root-gvisor",
    "root-gvisor-pool",
    "root-microvm-pool",
    "user",
]

# What the warm template or pool imports ahead of the runs (trusted runtime code): what the
# program imports. Under TCG (a microVM on a host without nested virtualisation) these imports
# take a minute or more, and matplotlib builds its font cache; in the snapshot they are done once.
PRELOAD = (
    "numpy",
    "pandas",
    "matplotlib.pyplot",
    "seaborn",
    "scipy.stats",
    "sklearn.linear_model",
    "statsmodels.api",
    "pyarrow.parquet",
    "openpyxl",
)


def preload_for(backend: str) -> tuple[str, ...]:
    """PRELOAD, less matplotlib (and seaborn, which imports it) in a microVM: there its import
    fails in the guest's preload and leaves submodules behind (``matplotlib._docstring``), so
    that the program's own ``import matplotlib`` then fails; the program imports it itself."""
    if backend != "microvm":
        return PRELOAD
    return tuple(m for m in PRELOAD if m.split(".")[0] not in ("matplotlib", "seaborn"))


CONVERT = """
import os
import pandas as pd
os.makedirs("out")
pd.read_csv("xy.csv").to_parquet("out/xy.parquet")
pd.read_csv("scores.csv").to_excel("out/scores.xlsx", index=False, sheet_name="scores")
"""

WORK = """
import base64
import json
import pathlib

for name, text in FILES.items():
    pathlib.Path(name).write_bytes(base64.b64decode(text))

import pandas as pd
import scipy.stats
import seaborn as sns
import statsmodels.api as sm
from sklearn.linear_model import LinearRegression
from statsmodels.stats.weightstats import ttest_ind as sm_ttest_ind

scores = pd.read_excel("scores.xlsx", sheet_name="scores")
xy = pd.read_parquet("xy.parquet")

ols = sm.OLS(xy["y"], sm.add_constant(xy[["x"]])).fit()
lr = LinearRegression().fit(xy[["x"]], xy["y"])
a = scores.loc[scores["group"] == "a", "score"]
b = scores.loc[scores["group"] == "b", "score"]
test = scipy.stats.ttest_ind(a, b)
sm_t, sm_p, sm_df = sm_ttest_ind(a, b)

ax = sns.regplot(data=xy, x="x", y="y", ci=None)  # no bootstrap: slow under emulation
ax.set_title("y against x")

print(json.dumps({
    "rows": [len(scores), len(xy)],
    "ols": [float(ols.params["const"]), float(ols.params["x"]), float(ols.rsquared)],
    "sklearn": [float(lr.intercept_), float(lr.coef_[0])],
    "ttest": [float(test.statistic), float(test.pvalue), float(test.df)],
    "statsmodels_ttest": [float(sm_t), float(sm_p), float(sm_df)],
}))
"""


def work_code(files: tuple[Path, Path]) -> str:
    """WORK with the files it reads written first: they travel in the program, not as inputs,
    because a pooled gVisor sandbox serves no run with inputs (they are mounts, fixed when it
    starts): such a run would start cold. Inputs have their own tests on every rung."""
    encoded = {p.name: base64.b64encode(p.read_bytes()).decode() for p in files}
    return f"FILES = {encoded!r}\n{WORK}"


# -- the data, and what the program must find in it ------------------------------------------------


def _profile_text() -> str:
    """The built-in analysis profile (``allowed_imports = ["@runtime"]``: the checks allow what
    the runtime offers) with the datascience runtime as its own, so that the executor's warm
    template or pool is of that runtime."""
    from importlib import resources

    text = resources.files("sandcell.policy").joinpath("builtin/analysis.toml").read_text()
    assert 'runtime = "analysis"' in text
    return text.replace('runtime = "analysis"', f'runtime = "{RUNTIME}"', 1)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Profile:
    path = tmp_path_factory.mktemp("profile") / "datascience-analysis.toml"
    path.write_text(_profile_text())
    return load_profile(str(path))


class Data:
    def __init__(self, where: Path) -> None:
        self.dir = where
        rng = np.random.default_rng(16)
        self.x = np.linspace(0.0, 10.0, 200)
        self.y = 2.5 + 1.75 * self.x + rng.normal(0.0, 0.5, self.x.size)
        self.a = rng.normal(10.0, 1.5, 60)
        self.b = rng.normal(12.0, 1.5, 60)
        # repr: every float goes through the files exactly.
        rows = [f"{x!r},{y!r}" for x, y in zip(self.x.tolist(), self.y.tolist(), strict=True)]
        (where / "xy.csv").write_text("x,y\n" + "\n".join(rows) + "\n")
        rows = [f"a,{v!r}" for v in self.a.tolist()] + [f"b,{v!r}" for v in self.b.tolist()]
        (where / "scores.csv").write_text("group,score\n" + "\n".join(rows) + "\n")

    def regression(self) -> tuple[float, float, float]:
        design = np.column_stack([np.ones_like(self.x), self.x])
        (intercept, slope), *_ = np.linalg.lstsq(design, self.y, rcond=None)
        residual = self.y - (intercept + slope * self.x)
        r2 = 1 - residual @ residual / ((self.y - self.y.mean()) ** 2).sum()
        return float(intercept), float(slope), float(r2)

    def t_statistic(self) -> float:
        na, nb = self.a.size, self.b.size
        pooled = ((na - 1) * self.a.var(ddof=1) + (nb - 1) * self.b.var(ddof=1)) / (na + nb - 2)
        return float((self.a.mean() - self.b.mean()) / np.sqrt(pooled * (1 / na + 1 / nb)))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    return Data(tmp_path_factory.mktemp("runtime-data-csv"))


@pytest.fixture(scope="module")
def data_files(
    data: Data, profile: Profile, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """``scores.xlsx`` and ``xy.parquet``, written by openpyxl and pyarrow in the runtime from
    the CSV files (shown to the run as inputs)."""
    if os.geteuid() != 0:
        pytest.skip("the in-process executor runs as root; this test run is not root")
    out = tmp_path_factory.mktemp("runtime-data")
    home = tmp_path_factory.mktemp("runtime-convert-home")
    with Executor(home=home, profile=profile, backend="namespaces") as ex:
        r = ex.run(
            RunRequest(
                code=CONVERT,
                runtime=RUNTIME,
                inputs=tuple(input_from_path(data.dir / n) for n in ("xy.csv", "scores.csv")),
                exports=("out/*",),
                limits=LIMITS,
            )
        )
        assert r.outcome is Outcome.OK, r.stderr
        media = {a.path: a.media_type for a in r.artifacts}
        assert media == {
            "out/xy.parquet": "application/octet-stream",
            "out/scores.xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        }
        for art in r.artifacts:
            dest = out / Path(art.path).name
            dest.write_bytes(ex.store.path_for(art.sha256).read_bytes())
    assert (out / "xy.parquet").read_bytes()[:4] == b"PAR1"
    assert (out / "scores.xlsx").read_bytes()[:2] == b"PK"
    return out / "scores.xlsx", out / "xy.parquet"


def check_findings(printed: str, data: Data) -> None:
    got = json.loads(printed)
    assert got["rows"] == [120, 200]
    intercept, slope, r2 = data.regression()
    # The estimates are the least-squares solution of the data sent in...
    assert got["ols"] == pytest.approx([intercept, slope, r2], rel=1e-9)
    assert got["sklearn"] == pytest.approx([intercept, slope], rel=1e-9)
    # ... and near the line the data was drawn from.
    assert abs(slope - 1.75) < 0.05 and abs(intercept - 2.5) < 0.2 and r2 > 0.98
    t, p, df = got["ttest"]
    assert t == pytest.approx(data.t_statistic(), rel=1e-9)
    assert df == 118.0
    assert 0 < p < 1e-6  # means 10 and 12, sd 1.5, 60 each: clearly apart
    assert got["statsmodels_ttest"] == pytest.approx([t, p, df], rel=1e-9)


# -- the cases ------------------------------------------------------------------------------------


def _ensure_vm_image() -> None:
    """The datascience runtime's guest image, built here when it is missing or stale (as
    ``sandcell vm build --runtime datascience`` would); a host without a usable microVM backend
    skips."""
    from sandcell.backends.microvm import image, probe

    status = probe()
    if not status.usable:
        backend_unavailable("microvm", status.detail)
    try:
        image.verify(runtime=RUNTIME)
    except IsolationUnavailable:
        image.build(runtime=RUNTIME)


@pytest.fixture(scope="module")
def work_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runtime-work-home")


@pytest.fixture(scope="module")
def executors() -> Iterator[dict[tuple[str, str], Executor]]:
    """Root executors per (rung, start mode), built on first use, closed with the module."""
    built: dict[tuple[str, str], Executor] = {}
    yield built
    for ex in built.values():
        ex.close()


def _executor(
    cache: dict[tuple[str, str], Executor], profile: Profile, home: Path, backend: str, start: str
) -> Executor:
    key = (backend, start)
    if key not in cache:
        if backend == "microvm":
            _ensure_vm_image()
        warm = None
        if start != "cold":
            preload = preload_for(backend)
            warm = WarmConfig(mode=start, pool_size=1, preload=preload)  # type: ignore[arg-type]
        try:
            cache[key] = Executor(home=home, profile=profile, backend=backend, warm=warm)
        except IsolationUnavailable as exc:
            backend_unavailable(backend, str(exc))
        # A pooled run that finds no sandbox ready within its wait starts cold; on a busy host
        # the datascience template (or the microVM's snapshot) can take longer than that.
        settle_pools({key: cache[key]}, timeout=600)
    return cache[key]


@pytest.mark.parametrize("case", CASES)
def test_datascience_work_runs_on_every_rung_and_start(
    case: str,
    request: pytest.FixtureRequest,
    data: Data,
    data_files: tuple[Path, Path],
    work_home: Path,
) -> None:
    identity, backend, start = parse_sandbox_param(case)
    if identity == "user":
        _run_as_user(request.getfixturevalue("unpriv"), data, data_files, backend, start)
        return
    cache = request.getfixturevalue("executors")
    ex = _executor(cache, request.getfixturevalue("profile"), work_home, backend, start)
    r = ex.run(
        RunRequest(
            code=work_code(data_files),
            runtime=RUNTIME,
            display=True,
            limits=LIMITS,
        )
    )
    assert r.outcome is Outcome.OK, r.stderr
    assert r.enforcement is not None and r.enforcement.backend == backend
    assert r.start.mode == start, r.start  # warm is of this runtime: no cold fallback
    check_findings(r.stdout, data)
    [figure] = r.outputs
    assert figure.kind == "figure"
    assert [(a.path, a.media_type) for a in figure.artifacts] == [
        ("display/0000.png", "image/png"),
        ("display/0000.svg", "image/svg+xml"),
    ]
    png = ex.store.path_for(figure.artifacts[0].sha256).read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000  # a drawn chart, not an empty canvas
    record = ex.audit.get(r.run_id)
    assert record is not None
    stored = find(RUNTIME)
    runtime = record.record["runtime"]
    assert isinstance(runtime, dict)
    assert (runtime["name"], runtime["tree_sha256"]) == (RUNTIME, stored.manifest.tree_sha256)


def _run_as_user(
    env: UnprivEnv, data: Data, data_files: tuple[Path, Path], backend: str, start: str
) -> None:
    args = ["run", "--json", "--profile", "analysis", "--runtime", RUNTIME, "--display"]
    args += ["--timeout", "120", "--cpu-time", "240", "-c", work_code(data_files)]
    if env.mode is IsolationMode.RLIMITS:
        args.insert(1, "--isolation=rlimits")
        # Memory is then an address-space limit, and numpy's and scipy's OpenBLAS each reserve
        # buffers per thread: 1 GiB of address space is not enough for this program (it uses
        # about 300 MiB). The profile's ceiling is.
        args += ["--memory", "2048"]
    if start != "cold":
        args.insert(1, f"--start={start}")
    if backend != "namespaces":
        args.insert(1, f"--backend={backend}")
    proc = run_as_user(env, args, timeout=300)
    assert proc.returncode == 0, (
        proc.returncode,
        proc.stdout[-3000:],
        proc.stderr.decode(errors="replace"),
    )
    body = json.loads(proc.stdout)
    assert body["outcome"] == "ok", body
    check_findings(body["stdout"], data)
    assert [o["kind"] for o in body["outputs"]] == ["figure"], body["outputs"]
    assert [a["media_type"] for a in body["outputs"][0]["artifacts"]] == [
        "image/png",
        "image/svg+xml",
    ]


# -- a tampered runtime -----------------------------------------------------------------------


def test_a_tampered_runtime_is_refused_before_any_sandbox_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module planted in a built runtime (``sitecustomize`` would run first in every program)
    makes the executor refuse the run before its backend is asked to start anything."""
    if os.geteuid() != 0:
        pytest.skip("the in-process executor runs as root; this test run is not root")
    monkeypatch.setenv("SANDCELL_RUNTIMES_DIR", str(tmp_path / "runtimes"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    forget_verified()
    stored = build(shipped_lock("minimal"), tmp_path / "runtimes")
    started: list[str] = []
    with Executor(home=tmp_path / "home", profile="unchecked", backend="namespaces") as ex:
        real_run = ex.backend.run

        def spy(req: RunRequest, *args: object, **kwargs: object) -> object:
            started.append(req.code)
            return real_run(req, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(ex.backend, "run", spy)
        probe = "import importlib.util\nprint(importlib.util.find_spec('numpy') is None)\n"
        r = ex.run(RunRequest(code=probe, runtime="minimal"))
        assert (r.outcome, r.stdout) == (Outcome.OK, "True\n"), r.stderr  # minimal: no numpy
        assert len(started) == 1

        site = stored.site_packages
        site.chmod(0o755)
        (site / "sitecustomize.py").write_text("print('planted')\n")
        forget_verified()  # this process verified the clean tree already
        with pytest.raises(IsolationUnavailable) as info:
            ex.run(RunRequest(code="print('hello')", runtime="minimal"))
        assert "tampered" in str(info.value)
        assert "sandcell runtime build minimal" in str(info.value)
        assert len(started) == 1  # no sandbox was asked for
    forget_verified()
