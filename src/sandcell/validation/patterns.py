"""Shapes of secrets: the patterns the leak scan (:mod:`sandcell.validation.redact`) looks for.

Each built-in pattern is chosen for few false positives: it starts with a fixed, public prefix
(``ghp_``, ``AKIA``, ``sk-ant-``, ``-----BEGIN``) or a context word (``aws_secret_access_key``,
``password``), and its length is bounded, so that scanning stays linear in the size of the
output. Patterns that start with a literal are searched for at C speed; that is why the
boundary checks below look backwards over the literal instead of coming first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from sandcell.errors import ConfigError

__all__ = ["DEFAULT_PATTERNS", "Pattern", "Severity"]

Severity = Literal["secret", "warning"]
"""``secret``: almost certainly a credential. ``warning``: looks like one (``password=...``)."""

_KIND = re.compile(r"[a-z0-9_]+\Z")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pattern:
    """A kind of secret recognised by its shape.

    The regex may name two groups: ``secret``, the part to redact (default: the whole match;
    ``password=`` stays readable, only the value goes), and ``public``, a leading part that is
    not secret and may be shown in the preview (``ghp_``).
    """

    kind: str
    """Lower-case name, shown in the marker ``[REDACTED:<kind>]`` and in the report."""
    regex: re.Pattern[str]
    """Written in ASCII: it also runs on bytes (``Redactor.scan_bytes``)."""
    severity: Severity = "secret"
    show_suffix: bool = True
    """Whether the preview may show the last four characters (not for PEM blocks, whose end
    is a fixed footer)."""
    ascii_lower: bool = False
    """Match against a copy of the text with ASCII letters in lower case (same offsets), with
    the regex's words written in lower case: much faster than ``re.IGNORECASE``."""

    def __post_init__(self) -> None:
        if not _KIND.match(self.kind):
            raise ConfigError(f"pattern kind {self.kind!r} must be lower-case letters, digits, _")


def _p(
    kind: str,
    regex: str,
    severity: Severity = "secret",
    *,
    show_suffix: bool = True,
    ascii_lower: bool = False,
) -> Pattern:
    return Pattern(
        kind=kind,
        regex=re.compile(regex),
        severity=severity,
        show_suffix=show_suffix,
        ascii_lower=ascii_lower,
    )


def _after(prefix: str, width: int, word: str = "A-Za-z0-9_") -> str:
    """``prefix`` (shown in previews), not preceded by a word character.

    A token inside a longer word is not that token (a hex dump, a hash). The literal comes
    first and the boundary is checked by looking back over it: a pattern that starts with a
    literal is searched for at C speed, one that starts with a lookbehind is tried at every
    position (ten times slower over a 64 MiB artifact).
    """
    return rf"(?P<public>{prefix})(?<![{word}].{{{width}}})"


_R = r"(?![A-Za-z0-9_])"
_RD = r"(?![A-Za-z0-9_\-])"
_WD = r"A-Za-z0-9_\-"

_PEM_END = r"-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----"
# A PEM body, also as a JSON string (lines joined by a literal \n): base64, headers such as
# "Proc-Type: 4,ENCRYPTED", whitespace, backslashes; never a quote, so a PEM block inside a JSON
# string is redacted without breaking the JSON around it.
_PEM_BODY = r"[A-Za-z0-9+/=\s:,\-.\\]"
_URL_CHARS = r"A-Za-z0-9\-._~%!$&()*+,;="  # RFC 3986 unreserved, pct-encoded, sub-delims
_VALUE = r"[A-Za-z0-9_\-+/=.~!@#$%^*]"


def _assignment(name: str) -> Pattern:
    """``<name>=<value>``, ``"<name>": "<value>"``... for a secret-sounding ``name``.

    One pattern per name, each starting with the literal first word (for speed, see
    :func:`_after`); a two-word name may be written with ``_``, ``-`` or nothing between.
    """
    first, _, second = name.partition(" ")
    word = rf"{first}(?<![a-z0-9].{{{len(first)}}})" + (rf"[_-]?{second}" if second else "")
    return _p(
        "secret_assignment",
        rf"{word}[\"']?\s*[:=]\s*[\"']?"
        rf"(?={_VALUE}{{0,255}}[0-9])(?={_VALUE}{{0,255}}[A-Za-z])"
        rf"(?P<secret>{_VALUE}{{12,256}})(?=[\"'\s,;&]|\Z)",
        "warning",
        ascii_lower=True,
    )


DEFAULT_PATTERNS: tuple[Pattern, ...] = (
    _p("aws_access_key_id", _after("A[KS]IA", 4, "A-Za-z0-9") + r"[A-Z0-9]{16}(?![A-Za-z0-9])"),
    _p(
        "aws_secret_access_key",
        # aws_secret_access_key, aws_secret_key, aws_secret, secret_access_key, any "_" left
        # out; written from the literal "secret" on, for speed.
        r"secret(?:(?<=aws_secret)|(?<=awssecret)|(?=_?access_?key))(?:_?access_?key|_?key)?"
        r"[\"']?\s*(?:=>|[=:])\s*[\"']?(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
        ascii_lower=True,
    ),
    _p("github_token", _after("gh[pousr]_", 4) + rf"[A-Za-z0-9]{{36,251}}{_R}"),
    _p("github_token", _after("github_pat_", 11) + rf"[A-Za-z0-9_]{{50,240}}{_R}"),
    _p("gitlab_token", _after("glpat-", 6, _WD) + rf"[{_WD}]{{20,250}}{_RD}"),
    _p("slack_token", _after("xox[abpr]-", 5, _WD) + rf"[A-Za-z0-9\-]{{10,250}}{_RD}"),
    _p("stripe_key", _after("sk_live_", 8) + rf"[A-Za-z0-9]{{20,250}}{_R}"),
    _p("stripe_key", _after("rk_live_", 8) + rf"[A-Za-z0-9]{{20,250}}{_R}"),
    _p("anthropic_key", _after("sk-ant-", 7, _WD) + rf"[{_WD}]{{32,250}}{_RD}"),
    # OpenAI: the project/service/admin forms by their prefix; the older form only at its exact
    # length or with "T3BlbkFJ" (base64 of "OpenAI") in the middle. A bare "sk-" is too common.
    _p(
        "openai_key",
        _after("sk-", 3, _WD) + rf"(?:(?:proj|svcacct|admin)-[{_WD}]{{40,250}}"
        rf"|[A-Za-z0-9]{{20}}T3BlbkFJ[A-Za-z0-9]{{20}}|[A-Za-z0-9]{{48}}){_RD}",
    ),
    _p("google_api_key", _after("AIza", 4, _WD) + rf"[{_WD}]{{35}}{_RD}"),
    # A JWT: base64url JSON header (always "eyJ", the encoding of '{"'), payload, signature.
    _p("jwt", _after("eyJ", 3, _WD) + rf"[{_WD}]{{8,}}\.[{_WD}]{{8,}}\.[{_WD}]{{8,}}{_RD}"),
    # Through the END line, or, when there is none (output cut at a limit), the whole body.
    # Both bounded, so a flood of BEGIN lines costs linear time.
    _p(
        "private_key",
        r"(?P<public>-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----)"
        rf"(?:{_PEM_BODY}{{0,65536}}?{_PEM_END}|{_PEM_BODY}{{0,65536}})",
        show_suffix=False,
    ),
    # scheme://user:password@host; only the password is redacted. "://" comes first for speed.
    _p(
        "url_credentials",
        rf"://(?<=[A-Za-z0-9+.\-]://)[{_URL_CHARS}]+:(?!\*+@)(?P<secret>[{_URL_CHARS}:]+)@"
        r"(?=[A-Za-z0-9\[])",
    ),
    _p(
        "authorization_header",
        r"authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+"
        r"(?P<secret>[A-Za-z0-9_\-+/=.~]{12,4096})(?![A-Za-z0-9_\-+/=.~])",
        ascii_lower=True,
    ),
    # A long value assigned to something called a password, secret, token or key. Only a
    # warning: it is a guess from the name. The value must mix letters and digits, which rules
    # out prose ("password: required") and code (password=settings.db_password).
    *(
        _assignment(name)
        for name in (
            "password",
            "passwd",
            "secret",
            "token",
            "api key",
            "access key",
            "auth token",
            "client secret",
            "private key",
        )
    ),
)
"""The built-in patterns. Each one has a fixed prefix or a context word and a bounded length."""
