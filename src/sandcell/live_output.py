"""Live output: a run's stdout and stderr handed to a caller while the program runs.

A backend reads the program's pipes and tells an :data:`~sandcell.backends.base.OutputSink`
each raw chunk (``("stdout" | "stderr", bytes)``). :class:`LiveOutput` is that sink on the
executor's side: what reaches the caller's listener is text that went through the same checks
as the run's final output:

* **decoded** incrementally as UTF-8 (``errors="replace"``): a character split across two reads
  is decoded whole;
* **redacted** by the same :class:`~sandcell.validation.redact.Redactor` (host secrets, the
  gateway's credentials, token shapes) the final stdout and stderr go through;
* **line-aware**: text is released a line at a time, so a token split across two reads is seen
  whole by the scan. A partial line (a prompt with no newline) is released after
  :data:`PARTIAL_AFTER_S` up to its last whitespace, and whole after :data:`WORD_AFTER_S` or
  once :data:`MAX_HELD_CHARS` are held; a PEM private key block is held from its ``BEGIN`` line
  to its ``END`` line (the scan redacts the block whole);
* **capped**: never more than the stream's cap of raw bytes per stream.

Isolation of the listener: the sink only appends to a queue and returns; one delivery thread per
run decodes, redacts and calls the listener. A slow listener therefore never stalls the
program's pipes (the queue holds at most the caps, which the backend already bounds), and a
listener that raises is not called again: a listener that failed once (typically a closed
connection) would fail on every later chunk, and calling it again could repeat a side effect
half done. The text it would have had is counted in :attr:`LiveOutput.dropped_chars`; the
run's final result still carries all of it. :meth:`LiveOutput.close` delivers what is left:
it waits for the delivery thread as long as that thread makes progress (decoding and redacting
at most the caps), but at most :data:`CLOSE_WAIT_S` for one call of the listener, so a stalled
listener delays the end of the run by that much at most (its thread, a daemon, is left to
return whenever it does, and is told nothing more), and a busy host delays it without losing
output.

Limits: what the final scan finds only in the whole output may be seen live unredacted: a
secret written in pieces more than :data:`WORD_AFTER_S` apart with no newline, a value written
more than :data:`PARTIAL_AFTER_S` after the whitespace that follows its name (``Authorization:
Bearer`` and then the token), or a secret split over lines other than a PEM block. Leaks are
reported in the final result, not here.
"""

from __future__ import annotations

import codecs
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from sandcell.validation.redact import Redactor

__all__ = [
    "CLOSE_WAIT_S",
    "MAX_HELD_CHARS",
    "PARTIAL_AFTER_S",
    "WORD_AFTER_S",
    "LiveOutput",
    "OutputListener",
    "Stream",
]

Stream = Literal["stdout", "stderr"]
OutputListener = Callable[[Stream, str], None]
"""A caller's listener: told ``(stream, text)`` with decoded, redacted text, in order."""

PARTIAL_AFTER_S = 0.05
"""A partial line waiting this long is released up to its last whitespace (a prompt shows)."""
WORD_AFTER_S = 0.5
"""A partial line waiting this long is released whole, its last word included."""
MAX_HELD_CHARS = 16384
"""A partial line this long is released whole at once (a progress bar without newlines)."""
MAX_PEM_CHARS = 70000
"""The longest private key block held back whole (the leak scan's own bound is 64 KiB)."""
CLOSE_WAIT_S = 2.0
"""How long :meth:`LiveOutput.close` waits for one call of the listener to return."""

_PEM_BEGIN = "-----BEGIN "
_PEM_END = "-----END "
_STREAMS: tuple[Stream, ...] = ("stdout", "stderr")
_CLOSE = object()


class _Pending:
    """One stream's text that is decoded but not yet released."""

    def __init__(self, cap: int, partial_after_s: float, word_after_s: float) -> None:
        self.cap = cap
        self.partial_after_s = partial_after_s
        self.word_after_s = word_after_s
        self.taken = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.since = 0.0
        """When the oldest held character arrived (monotonic)."""

    def feed(self, data: bytes, now: float) -> None:
        room = self.cap - self.taken
        if room <= 0:
            return
        data = data[:room]
        self.taken += len(data)
        decoded = self.decoder.decode(data)
        if decoded and not self.text:
            self.since = now
        self.text += decoded

    def release(self, now: float, *, final: bool) -> str:
        """The text that may go out now; the rest stays held."""
        if final:
            self.text += self.decoder.decode(b"", final=True)
            out, self.text = self.text, ""
            return out
        end = self.text.rfind("\n") + 1
        if end == 0:
            age = now - self.since
            if len(self.text) >= MAX_HELD_CHARS or age >= self.word_after_s:
                end = len(self.text)
            elif age >= self.partial_after_s:
                end = max(self.text.rfind(" "), self.text.rfind("\t")) + 1
        end = _before_open_pem(self.text, end)
        out, self.text = self.text[:end], self.text[end:]
        if out:
            self.since = now
        return out


def _before_open_pem(text: str, end: int) -> int:
    """``end``, moved back to the start of a PEM block that begins before it and has not ended
    yet (so the scan sees the block whole), unless the block is already too long to hold."""
    begin = text.rfind(_PEM_BEGIN, 0, end)
    if begin < 0 or text.find(_PEM_END, begin) >= 0:
        return end
    if "PRIVATE KEY" not in text[begin : begin + 80]:
        return end
    if len(text) - begin > MAX_PEM_CHARS:
        return end
    return begin


class LiveOutput:
    """Turns a caller's listener into an output sink for one run (see the module docstring).

    Args:
        listener: Told ``(stream, text)``; called from this object's delivery thread.
        caps: Raw bytes per stream that may be passed on (the run's ``stdout_bytes`` and
            ``stderr_bytes`` limits).
        known_secrets: Values redacted wherever they appear, as in the final output.
        partial_after_s, word_after_s: How long a partial line is held (see the module
            docstring).
    """

    def __init__(
        self,
        listener: OutputListener,
        *,
        caps: Mapping[str, int],
        known_secrets: Sequence[str] = (),
        redactor: Redactor | None = None,
        partial_after_s: float | None = None,
        word_after_s: float | None = None,
    ) -> None:
        # Read now, not when the module was loaded, so that a test can hold partial lines.
        partial_after_s = PARTIAL_AFTER_S if partial_after_s is None else partial_after_s
        word_after_s = WORD_AFTER_S if word_after_s is None else word_after_s
        self._listener = listener
        self._redactor = redactor if redactor is not None else Redactor(known_secrets)
        self._poll_s = partial_after_s
        self._pending = {s: _Pending(int(caps[s]), partial_after_s, word_after_s) for s in _STREAMS}
        self._queue: queue.SimpleQueue[tuple[str, bytes] | object] = queue.SimpleQueue()
        self._closed = False
        self._failed = False
        self.dropped_chars = 0
        """Text not delivered: the listener raised, or did not keep up before :meth:`close`
        gave up on it."""
        self.error: BaseException | None = None
        """What the listener raised, if it did (it is not called again after that)."""
        self._abandoned = threading.Event()
        self._calling_since: float | None = None
        """When the listener call in progress began (monotonic); None between calls."""
        self._thread = threading.Thread(target=self._deliver, name="sandcell-live", daemon=True)
        self._thread.start()

    def __call__(self, stream: str, data: bytes) -> None:
        """The :data:`~sandcell.backends.base.OutputSink`: queue the chunk and return."""
        if stream in self._pending and data and not self._closed:
            self._queue.put((stream, bytes(data)))

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Release everything held (the run has ended) and wait until the listener has had it,
        or until one call of the listener has taken ``wait_s``: then what is left is dropped.
        Idempotent."""
        if not self._closed:
            self._closed = True
            self._queue.put(_CLOSE)
        while self._thread.is_alive():
            self._thread.join(min(wait_s, 0.1))
            since = self._calling_since
            if since is not None and time.monotonic() - since >= wait_s:
                self._abandoned.set()  # the listener is stuck: whatever is left is dropped
                return

    def __enter__(self) -> LiveOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the delivery thread --------------------------------------------------------------------

    def _deliver(self) -> None:
        while True:
            held = any(p.text for p in self._pending.values())
            try:
                item = self._queue.get(timeout=self._poll_s if held else None)
            except queue.Empty:
                item = None
            now = time.monotonic()
            if item is _CLOSE:
                for stream in _STREAMS:
                    self._emit(stream, self._pending[stream].release(now, final=True))
                return
            if isinstance(item, tuple):
                stream, data = item
                self._pending[stream].feed(data, now)
            for stream in _STREAMS:
                self._emit(stream, self._pending[stream].release(now, final=False))

    def _emit(self, stream: Stream, text: str) -> None:
        if not text:
            return
        if self._failed or self._abandoned.is_set():
            self.dropped_chars += len(text)
            return
        safe, _ = self._redactor.scan_text(text)
        self._calling_since = time.monotonic()
        try:
            self._listener(stream, safe)
        except Exception as exc:  # any listener failure is contained here
            self._failed = True
            self.error = exc
            self.dropped_chars += len(text)
        finally:
            self._calling_since = None
