"""The live output wrapper: decode, redact across chunks, cap, and contain a bad listener."""

from __future__ import annotations

import threading

from sandcell.live_output import LiveOutput, Stream

TOKEN = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5"
CAPS = {"stdout": 1 << 20, "stderr": 1 << 20}
# Where a test passes partial_after_s=word_after_s=600, a partial line is never released by
# age: what the test sees does not depend on timing.


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Stream, str]] = []
        self.seen = threading.Condition()

    def __call__(self, stream: Stream, text: str) -> None:
        with self.seen:
            self.events.append((stream, text))
            self.seen.notify_all()

    def text(self, stream: Stream = "stdout") -> str:
        return "".join(t for s, t in self.events if s == stream)

    def wait_for(self, needle: str, stream: Stream = "stdout") -> bool:
        with self.seen:
            return self.seen.wait_for(lambda: needle in self.text(stream), timeout=30)


def test_a_token_split_across_chunks_is_redacted() -> None:
    rec = Recorder()
    live = LiveOutput(rec, caps=CAPS, partial_after_s=600, word_after_s=600)
    live("stdout", f"key {TOKEN[:10]}".encode())
    live("stdout", f"{TOKEN[10:]} end\nnext\n".encode())
    live.close()
    assert TOKEN not in rec.text()
    assert TOKEN[10:] not in rec.text()
    assert rec.text() == "key [REDACTED:github_token] end\nnext\n"


def test_known_secrets_are_redacted_as_in_the_final_output() -> None:
    rec = Recorder()
    secret = "hunter2-correct-horse"
    live = LiveOutput(rec, caps=CAPS, known_secrets=[secret], partial_after_s=600, word_after_s=600)
    live("stderr", b"pw: hunter2-")
    live("stderr", b"correct-horse\n")
    live.close()
    assert rec.text("stderr") == "pw: [REDACTED:known_secret]\n"


def test_a_character_split_across_chunks_is_decoded_whole() -> None:
    rec = Recorder()
    live = LiveOutput(rec, caps=CAPS, partial_after_s=600, word_after_s=600)
    data = "héllo ✓\n".encode()
    for i in range(len(data)):
        live("stdout", data[i : i + 1])
    live("stdout", b"\xff\n")
    live.close()
    assert rec.text() == "héllo ✓\n\ufffd\n"


def test_a_partial_line_is_released_without_a_newline() -> None:
    rec = Recorder()
    live = LiveOutput(rec, caps=CAPS, partial_after_s=0.01, word_after_s=0.02)
    live("stdout", b"Continue? [y/n] ")
    # Nothing else comes and the run goes on: the prompt shows anyway (waited for, not timed).
    assert rec.wait_for("Continue? [y/n] ")
    live("stdout", b"ok\n")
    live.close()
    assert rec.text() == "Continue? [y/n] ok\n"


def test_the_cap_is_respected_per_stream() -> None:
    rec = Recorder()
    live = LiveOutput(rec, caps={"stdout": 10, "stderr": 4})
    live("stdout", b"0123456")
    live("stdout", b"789abcdef\n")
    live("stderr", b"ERROR\n")
    live.close()
    assert rec.text() == "0123456789"
    assert rec.text("stderr") == "ERRO"


def test_a_private_key_block_is_held_until_it_ends() -> None:
    rec = Recorder()
    live = LiveOutput(rec, caps=CAPS, partial_after_s=600, word_after_s=600)
    body = "MIIEowIBAAKCAQEA" + "x" * 48
    live("stdout", b"before\n-----BEGIN RSA PRIVATE KEY-----\n")
    assert rec.wait_for("before\n")
    live("stdout", f"{body}\n{body}\n".encode())
    live("stdout", b"-----END RSA PRIVATE KEY-----\nafter\n")
    live.close()
    assert body not in rec.text()
    assert rec.text().startswith("before\n[REDACTED:private_key]")
    assert rec.text().endswith("after\n")


def test_a_listener_that_raises_is_not_called_again_and_the_sink_goes_on() -> None:
    calls: list[str] = []

    def broken(stream: Stream, text: str) -> None:
        calls.append(text)
        raise RuntimeError("the connection is gone")

    live = LiveOutput(broken, caps=CAPS)
    live("stdout", b"one\n")
    live.close()  # delivers "one": the listener raises
    live("stdout", b"two\n")  # after close: ignored, never raises
    assert calls == ["one\n"]
    assert isinstance(live.error, RuntimeError)
    assert live.dropped_chars == len("one\n")


def test_a_stalled_listener_neither_blocks_the_sink_nor_close() -> None:
    release = threading.Event()
    got: list[str] = []

    def stalled(stream: Stream, text: str) -> None:
        got.append(text)
        release.wait(60)

    live = LiveOutput(stalled, caps=CAPS)
    for i in range(1000):
        live("stdout", f"line {i}\n".encode())  # returns at once: queued
    live.close(wait_s=0.2)
    release.set()
    live._thread.join(30)
    assert not live._thread.is_alive()
    assert len(got) <= 2  # the first batch, then everything left was dropped, not delivered
    assert live.dropped_chars > 0


def test_gvisor_exit_trailer_is_never_passed_on_live() -> None:
    from sandcell.backends.cell import CappedOutput
    from sandcell.backends.gvisor._agent import EXIT
    from sandcell.backends.gvisor.supervise import trailer_tail

    told: list[bytes] = []
    err = CappedOutput(1 << 20, stream="stderr", on_output=lambda s, b: told.append(b))
    err.hold = trailer_tail
    for piece in (b"oops\n", b"tail \x00", EXIT[1:8], EXIT[8:], b"12", b"7\n"):
        err.add(piece)
    # Everything up to the NUL went out; what may be the trailer was held.
    assert b"".join(told) == b"oops\ntail "
    del err.data[-len(EXIT + b"127\n") :]  # the backend removes the trailer at the end
    err.flush()
    assert b"".join(told) == b"oops\ntail "
    # A NUL that turns out not to start a trailer is passed on once that is clear.
    err.add(b"\x00not a trailer\n")
    assert b"".join(told) == b"oops\ntail \x00not a trailer\n"
    assert trailer_tail(b"plain") == 0 and trailer_tail(EXIT + b"12") == len(EXIT) + 2
