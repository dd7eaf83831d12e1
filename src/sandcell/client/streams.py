"""Reading the service's event streams: a run's ``/events`` and a streamed session cell.

Both clients (blocking and asyncio) feed the lines of a ``text/event-stream`` answer to one
:class:`EventReader`; it calls the caller's ``on_output`` for each ``stdout``/``stderr`` event
(as :meth:`sandcell.Executor.run` would, with the same text) and gives the result when the
stream's ``result`` event arrives, or raises the error an ``error`` event carries.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sandcell.client.errors import error_for
from sandcell.errors import ConfigError
from sandcell.spec import RunResult

if TYPE_CHECKING:
    from sandcell.live_output import OutputListener

__all__ = ["EventLines", "EventReader", "event_error", "event_object"]

_OUTPUT = ("stdout", "stderr")


class EventReader:
    """Lines in; the result out once it has come.

    Args:
        read_result: The result from the ``result`` event's data.
        on_output: Told ``(stream, text)`` for each piece of output, on the caller's thread
            (the asyncio client: on its event loop, so it must return quickly).
        what, where: Name the request and the service in errors.
    """

    def __init__(
        self,
        read_result: Callable[[Mapping[str, Any]], RunResult],
        *,
        on_output: OutputListener | None,
        what: str,
        where: str,
    ) -> None:
        self._read_result = read_result
        self._on_output = on_output
        self._what = what
        self._where = where
        self._lines = EventLines()

    def feed(self, line: str) -> RunResult | None:
        """One line of the stream (without its line break); the result once it is complete."""
        event = self._lines.feed(line)
        if event is None:
            return None
        kind, data = event
        if kind in _OUTPUT:
            if self._on_output is not None:
                text = event_object(data).get("text")
                if isinstance(text, str) and text:
                    self._on_output(kind, text)  # type: ignore[arg-type]
            return None
        if kind == "result":
            return self._read_result(event_object(data))
        if kind == "error":
            raise event_error(data, what=self._what, where=self._where)
        return None  # status, output_limit, and kinds a newer service may add


class EventLines:
    """The lines of a ``text/event-stream`` in (without their line breaks); each event's
    ``(kind, data)`` out once the blank line that ends it has come."""

    def __init__(self) -> None:
        self._event: dict[str, str] = {}

    def feed(self, line: str) -> tuple[str, str] | None:
        if line.startswith(":"):
            return None  # a keep-alive comment
        if line:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data" and "data" in self._event:
                self._event["data"] += "\n" + value
            else:
                self._event[name] = value
            return None
        kind, data = self._event.get("event", "message"), self._event.get("data", "")
        self._event = {}
        return kind, data


def event_error(data: str, *, what: str, where: str) -> Exception:
    """The error an ``error`` event's problem document stands for (the one the same answer
    would have been, had the stream not begun)."""
    status = event_object(data).get("status")
    return error_for(
        status if isinstance(status, int) else 500, data.encode(), {}, what=what, where=where
    )


def event_object(data: str) -> dict[str, Any]:
    """An event's data, which must be a JSON object."""
    try:
        found = json.loads(data)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise ConfigError(f"the service sent an event that is not a JSON object: {data[:200]!r}")
    return found
