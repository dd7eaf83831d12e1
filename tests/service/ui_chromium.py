"""A real headless Chromium, driven over the DevTools protocol on a pipe (no download, no
websocket): ``--remote-debugging-pipe`` reads commands on fd 3 and writes answers and events on
fd 4, each a JSON message ended by a NUL byte.

Only what the /ui tests need: open a page, read it, click an element and type into one the way a
person does (mouse and keyboard events at the element's place on the screen, so the page's own
forms submit as a browser submits them), and take a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Chromium", "chromium_path"]


def _high(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    """One headless browser with one page."""

    def __init__(self, profile_dir: Path, *, width: int = 1200, height: int = 900) -> None:
        binary = chromium_path()
        if binary is None:
            raise RuntimeError("no chromium on PATH")
        self.log = profile_dir.with_name(profile_dir.name + ".log")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Moved above 9 first: a pipe may itself be 3 or 4, which the redirections below reuse.
        to_child_r, from_child_w = (_high(to_child_r), _high(from_child_w))
        flags = [
            "--headless",
            "--no-sandbox",  # the tests run as root, where Chromium's own sandbox refuses to start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile_dir}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        # The protocol's descriptors must be exactly 3 and 4 in the browser.
        script = (
            f'exec "$0" "$@" 3<&{to_child_r} 4>&{from_child_w} {to_child_r}<&- {from_child_w}>&-'
        )
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                ["bash", "-c", script, binary, *flags],
                pass_fds=(to_child_r, from_child_w),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        os.close(to_child_r)
        os.close(from_child_w)
        self._next_id = 0
        self._answers: dict[int, dict[str, Any]] = {}
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.page("Page.enable")
        self.page("Runtime.enable")
        self.page(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    # -- protocol ------------------------------------------------------------------------

    def _read(self) -> None:
        buffer = b""
        while True:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                with self._cond:
                    self._cond.notify_all()
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._cond:
                        self._answers[message["id"]] = message
                        self._cond.notify_all()
                else:
                    self._events.put(message)

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        self._next_id += 1
        ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while ident not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    tail = self.log.read_text(errors="replace")[-2000:]
                    raise TimeoutError(f"chromium did not answer {method}; its log ends:\n{tail}")
                self._cond.wait(left)
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def page(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.send(method, params, session=self.session)

    # -- what a test does ----------------------------------------------------------------

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (read-only uses: the DOM's text, a
        rectangle, the URL)."""
        answer = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 120.0) -> Any:
        """Poll until ``expression`` is truthy in a fully loaded page; its value."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                if self.evaluate("document.readyState") == "complete":
                    last = self.evaluate(expression)
                    if last:
                        return last
            except RuntimeError:
                pass  # the page is being replaced by the next one
            time.sleep(0.1)
        raise TimeoutError(f"never true: {expression} (last {last!r}) at {self.url()}")

    def goto(self, url: str, timeout: float = 60.0) -> None:
        """Open ``url`` and wait until the page it ends on (after redirects) has loaded."""
        while not self._events.empty():
            self._events.get_nowait()
        self.page("Page.navigate", {"url": url})
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{url} never loaded")
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                continue
            if event.get("method") == "Page.loadEventFired":
                return

    def url(self) -> str:
        return str(self.evaluate("location.href"))

    def text(self, selector: str = "body") -> str:
        value = self.evaluate(
            f"(e => e ? e.textContent : null)(document.querySelector({json.dumps(selector)}))"
        )
        if value is None:
            raise AssertionError(f"no {selector} on {self.url()}")
        return str(value)

    def click(self, selector: str) -> None:
        """A left click in the middle of the element, as mouse events."""
        box = self.evaluate(
            "(e => { if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })"
            f"(document.querySelector({json.dumps(selector)}))"
        )
        if box is None:
            raise AssertionError(f"no {selector} to click on {self.url()}")
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.page(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    def type_into(self, selector: str, text: str) -> None:
        """Click the field, then type ``text`` as keyboard input."""
        self.click(selector)
        self.page("Input.insertText", {"text": text})

    def screenshot(self, path: Path) -> None:
        data = self.page("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(data["data"]))

    def close(self) -> None:
        with contextlib.suppress(TimeoutError, RuntimeError, OSError):
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)
        self._reader.join(15)
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
