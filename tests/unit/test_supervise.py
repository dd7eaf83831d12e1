"""The supervision every rung shares (Watch, pump), over real pipes: caps, deadline, cancel, the
first descriptor of a batch, the rung's hooks."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest

from sandcell.backends.host.supervise import STDERR, STDOUT, Watch, pump


@pytest.fixture
def pipes() -> Iterator[list[tuple[int, int]]]:
    made = [os.pipe2(os.O_CLOEXEC) for _ in range(4)]
    yield made
    for r, w in made:
        for fd in (r, w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _watch(*, deadline_s: float = 5.0, **kw: object) -> Watch:
    return Watch(
        stdout_cap=10,
        stderr_cap=4,
        deadline=time.monotonic() + deadline_s,
        **kw,  # type: ignore[arg-type]
    )


def test_output_under_the_caps_until_both_streams_end(pipes: list[tuple[int, int]]) -> None:
    (out_r, out_w), (err_r, err_w) = pipes[0], pipes[1]
    told: list[tuple[str, bytes]] = []
    watch = _watch(on_output=lambda s, b: told.append((s, b)))
    os.write(out_w, b"hello")
    os.write(err_w, b"err")
    os.close(out_w)
    os.close(err_w)
    fds = {out_r: STDOUT, err_r: STDERR}
    pump(watch, fds, stop_fd=None)
    assert fds == {}
    assert watch.stopped_by is None
    assert (bytes(watch.data[STDOUT]), bytes(watch.data[STDERR])) == (b"hello", b"err")
    assert sorted(told) == [(STDERR, b"err"), (STDOUT, b"hello")]


def test_a_stream_over_its_cap_stops_the_run(pipes: list[tuple[int, int]]) -> None:
    (out_r, out_w), (err_r, _) = pipes[0], pipes[1]
    told: list[bytes] = []
    watch = _watch(on_output=lambda _s, b: told.append(b))
    os.write(out_w, b"0123456789abc")
    pump(watch, {out_r: STDOUT, err_r: STDERR}, stop_fd=None)
    assert watch.stopped_by == STDOUT
    assert watch.truncated == {STDOUT: True, STDERR: False}
    assert bytes(watch.data[STDOUT]) == b"0123456789" and told == [b"0123456789"]


def test_the_stderr_slack_lets_a_trailer_past_the_cap(pipes: list[tuple[int, int]]) -> None:
    err_r, err_w = pipes[0]
    watch = _watch(stderr_slack=3)
    os.write(err_w, b"abcdefg")
    os.close(err_w)
    pump(watch, {err_r: STDERR}, stop_fd=None)
    assert watch.stopped_by is None and bytes(watch.data[STDERR]) == b"abcdefg"


def test_the_deadline_stops_the_run_by_its_name(pipes: list[tuple[int, int]]) -> None:
    out_r, _ = pipes[0]
    watch = _watch(deadline_s=0.05, expiry="setup")
    t0 = time.monotonic()
    pump(watch, {out_r: STDOUT}, stop_fd=None)
    assert watch.stopped_by == "setup"
    assert 0.04 <= time.monotonic() - t0 < 2


def test_a_byte_on_the_stop_pipe_cancels(pipes: list[tuple[int, int]]) -> None:
    (out_r, _), (stop_r, stop_w) = pipes[0], pipes[1]
    watch = _watch()
    os.write(stop_w, b"x")
    pump(watch, {out_r: STDOUT}, stop_fd=stop_r)
    assert watch.stopped_by == "cancelled"


def test_a_cancel_names_the_stop_until_the_run_is_over() -> None:
    watch = _watch()
    watch.stop("wall_time")
    watch.stop(STDOUT)
    assert watch.stopped_by == "wall_time"
    watch.cancel()
    assert watch.stopped_by == "cancelled"
    over = _watch()
    over.over = True
    over.cancel()
    assert over.output(STDOUT, b"x" * 11)
    assert over.stopped_by is None and over.truncated[STDOUT]


def test_the_first_descriptor_is_read_first_and_hooks_see_the_rest(
    pipes: list[tuple[int, int]],
) -> None:
    (out_r, out_w), (st_r, st_w) = pipes[0], pipes[1]
    seen: list[tuple[str, bytes]] = []
    watch = _watch()
    os.write(out_w, b"0123456789abc")
    os.write(st_w, b"1")

    def status(_fd: int, kind: str, chunk: bytes) -> None:
        seen.append((kind, chunk))

    pump(watch, {out_r: STDOUT, st_r: "status"}, stop_fd=None, first=st_r, other=status)
    # The cap ended the run, but the status byte of the same batch was read.
    assert watch.stopped_by == STDOUT and seen == [("status", b"1")]


def test_the_rungs_clock_and_after_batch_check(pipes: list[tuple[int, int]]) -> None:
    (out_r, out_w), (other_r, _) = pipes[0], pipes[1]
    watch = _watch()
    ticks: list[float] = []

    def clock(now: float) -> float:
        ticks.append(now)
        if len(ticks) == 3:
            watch.stop("cpu_time")
        return now + 0.01

    pump(watch, {other_r: STDOUT}, stop_fd=None, clock=clock)
    assert watch.stopped_by == "cpu_time" and len(ticks) == 3

    done = _watch()
    os.write(out_w, b"hi")
    pump(done, {out_r: STDOUT}, stop_fd=None, after=lambda: True)
    assert done.stopped_by is None and bytes(done.data[STDOUT]) == b"hi"
