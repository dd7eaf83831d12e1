"""The /ui building blocks on their own: the escaping filter, records of unexpected shapes, the
form checks and the browser sessions' expiry."""

from __future__ import annotations

import pytest
from markupsafe import Markup
from starlette.requests import Request

from sandcell.service.ui.browser_sessions import BrowserSessions
from sandcell.service.ui.guard import FormRefused, check_form
from sandcell.service.ui.render import page, visible
from sandcell.service.ui.views import code_lines, run_view


def test_visible_escapes_markup_and_shows_hidden_characters() -> None:
    shown = visible("</textarea><script>alert('x')</script> & \"q\"")
    assert isinstance(shown, Markup)
    assert shown == (
        "&lt;/textarea&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &#34;q&#34;"
    )
    # Bidi override, zero-width space, ESC, CR: visible escapes; tab, newline, letters kept.
    shown = visible("a\u202eb\u200bc\x1b[31md\re\tf\ng é 中")
    for escape in ("\\u202e", "\\u200b", "\\x1b", "\\r"):
        assert f'<span class="esc" title="hidden character">{escape}</span>' in shown
    assert "\u202e" not in shown and "\x1b" not in shown and "\u200b" not in shown
    assert "\tf\ng é 中" in shown
    # Markup handed in is escaped too: nothing from outside is trusted as HTML.
    assert visible(Markup("<b>")) == "&lt;b&gt;"
    assert visible(None) == ""


def test_a_page_escapes_whatever_it_is_given() -> None:
    response = page(
        "error.html",
        {"base": "/ui", "status": 400, "detail": "<b>x</b>", "tenant": None, "csrf": ""},
    )
    body = bytes(response.body).decode()
    assert "&lt;b&gt;x&lt;/b&gt;" in body and "<b>x</b>" not in body


def test_code_lines_split_on_newline_only() -> None:
    assert code_lines("a\rb\nc\n") == ("a\rb", "c")
    assert code_lines("") == ("",)


def test_a_record_of_unexpected_shapes_is_read_without_trusting_it() -> None:
    view = run_view(
        {
            "run_id": 7,
            "outcome": ["ok"],
            "policy": "allow",
            "outputs": "figure",
            "artifacts": [{"path": "a.txt"}, "x", {"sha256": "ab", "path": 'd/e"f.png'}],
            "network": {"connections": [1, {"host": "<h>"}]},
            "tools": [],
            "usage": {"wall_ms": "fast", "cpu_ms": True},
            "enforcement": {"layers": None},
        }
    )
    assert view.run_id == "7" and view.verdict == "none recorded"
    assert view.outputs == () and view.usage == ()
    (artifact,) = view.artifacts  # the one with a hash
    assert artifact.name == 'e"f.png' and artifact.image is False  # no media type: not inline
    assert view.connections == ({"host": "<h>"},)
    assert view.tools is None and view.tool_calls == ()


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request(
        {
            "type": "http",
            "method": "POST",
            "scheme": "http",
            "server": ("127.0.0.1", 8790),
            "path": "/ui/login",
            "headers": [(b"host", b"127.0.0.1:8790"), *raw],
        }
    )


def test_form_checks() -> None:
    sessions = BrowserSessions()
    mine, other = sessions.new("ann"), sessions.new("ann")
    own = "http://127.0.0.1:8790"
    check_form(_request({"Origin": own}), mine, {"csrf": mine.csrf})
    check_form(_request({"Referer": own + "/ui/"}), mine, {"csrf": mine.csrf})
    check_form(_request({"Origin": own.upper()}), mine, {"csrf": mine.csrf})
    for headers, form in (
        ({"Origin": own}, {}),
        ({"Origin": own}, {"csrf": other.csrf}),
        ({"Origin": own}, {"csrf": mine.csrf[:-1]}),
        ({"Origin": "http://127.0.0.1:8791"}, {"csrf": mine.csrf}),
        ({"Origin": "null"}, {"csrf": mine.csrf}),
        ({}, {"csrf": mine.csrf}),
        ({"Referer": own + ".evil.example/ui/"}, {"csrf": mine.csrf}),
        ({"Referer": "http://evil.example/?" + own + "/"}, {"csrf": mine.csrf}),
        # An Origin decides even when the Referer would pass.
        ({"Origin": "http://evil.example", "Referer": own + "/ui/"}, {"csrf": mine.csrf}),
    ):
        with pytest.raises(FormRefused):
            check_form(_request(headers), mine, form)
    with pytest.raises(FormRefused, match="no session"):
        check_form(_request({"Origin": own}), None, {"csrf": mine.csrf})


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_browser_sessions_end() -> None:
    clock = _Clock()
    sessions = BrowserSessions(idle_s=60, lifetime_s=300, clock=clock)
    session = sessions.new("ann")
    clock.now += 59
    assert sessions.get(session.id) is not None
    assert sessions.get("x" * 43) is None and sessions.get(None) is None
    clock.now += 61
    assert sessions.get(session.id) is None, "idle past its limit"

    busy = sessions.new("ann")
    for _ in range(5):
        clock.now += 50
        assert sessions.get(busy.id) is not None
    clock.now += 51
    assert sessions.get(busy.id) is None, "past its lifetime, however busy"

    a, b, c = sessions.new("ann"), sessions.new("bob"), sessions.new("ann")
    assert sessions.end_tenant("ann") == 2
    assert sessions.get(a.id) is None and sessions.get(c.id) is None
    assert sessions.get(b.id) is not None
    sessions.end(b.id)
    assert sessions.get(b.id) is None


def test_the_run_page_says_how_many_refused_attempts_are_not_listed() -> None:
    view = run_view(
        {
            "run_id": "r1",
            "network": {
                "profile": "p",
                "connections": [{"seq": 9, "host": "api.test", "allowed": True}],
                "refused_dropped": 40,
            },
        }
    )
    assert view.refused_dropped == 40
    body = bytes(
        page("run.html", {"base": "/ui", "r": view, "recorded": True, "tenant": None}).body
    ).decode()
    assert "api.test" in body
    assert "and 40 more refused attempts past the cap on refused records, not listed" in body
