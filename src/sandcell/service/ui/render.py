"""Turning a page's data into HTML: Jinja templates with autoescape on for every template.

Autoescape makes escaping the default: every ``{{ value }}`` is HTML-escaped unless it is
:class:`~markupsafe.Markup`, and the only Markup made here is :func:`visible`'s, built from
escaped pieces. On top of escaping, :func:`visible` shows the characters that would make a person
read something other than what is there (bidi overrides, zero-width characters, terminal
escapes) as a marked ``\\u202e``-style escape, as the terminal commands do.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape
from starlette.responses import HTMLResponse

__all__ = ["page", "pretty_json", "size", "visible"]

_TEMPLATES = Path(__file__).with_name("templates")
_SUSPECT = re.compile(r"([^\t\n\x20-\x7e])")
"""Characters worth a second look: everything but printable ASCII, tab and newline."""
_HIDDEN = ("Cc", "Cf", "Cs", "Zl", "Zp", "Co", "Cn")


def _shown(ch: str) -> Markup:
    if unicodedata.category(ch) in _HIDDEN:
        return Markup('<span class="esc" title="hidden character">{}</span>').format(
            ascii(ch)[1:-1]
        )
    return escape(ch)


def visible(value: object) -> Markup:
    """``value`` as text, escaped, with hidden and control characters made visible."""
    parts = _SUSPECT.split("" if value is None else str(value))
    # re.split with one group: even places are runs of plain ASCII, odd places one suspect char.
    return Markup("").join(
        escape(part) if i % 2 == 0 else _shown(part) for i, part in enumerate(parts)
    )


def pretty_json(value: object) -> str:
    """Indented JSON of a record's part (escaped by the template like any text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def size(value: object) -> str:
    """A byte count for a person: ``517 B``, ``3.4 KiB``, ``12.0 MiB``."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "?"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["visible"] = visible
    env.filters["pretty_json"] = pretty_json
    env.filters["size"] = size
    return env


_ENV = _environment()


def page(
    template: str,
    context: Mapping[str, object],
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> HTMLResponse:
    """The template rendered with ``context``, as an HTML response."""
    html = _ENV.get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers=dict(headers or {}))
