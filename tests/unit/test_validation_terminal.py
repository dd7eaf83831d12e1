"""Terminal safety: every class of control sequence is made visible, ordinary text is kept."""

from __future__ import annotations

import pytest

from sandcell.validation import is_tty_safe, neutralise

ESC = "\x1b"
BEL = "\x07"
ST = ESC + "\\"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("CSI colour", f"{ESC}[31mred{ESC}[0m", "\\x1b[31mred\\x1b[0m"),
        ("CSI clear screen", f"{ESC}[2J{ESC}[H", "\\x1b[2J\\x1b[H"),
        (
            "OSC 8 hyperlink",
            f"{ESC}]8;;https://evil.example{BEL}click{ESC}]8;;{BEL}",
            "\\x1b]8;;https://evil.example\\x07click\\x1b]8;;\\x07",
        ),
        ("OSC 52 clipboard", f"{ESC}]52;c;Y3VybA=={ST}", "\\x1b]52;c;Y3VybA==\\x1b\\"),
        ("OSC title", f"{ESC}]0;pwned{BEL}", "\\x1b]0;pwned\\x07"),
        ("DCS", f"{ESC}P$q m{ST}", "\\x1bP$q m\\x1b\\"),
        ("APC", f"{ESC}_Gf=100;AAAA{ST}", "\\x1b_Gf=100;AAAA\\x1b\\"),
        ("PM", f"{ESC}^privacy{ST}", "\\x1b^privacy\\x1b\\"),
        ("SOS", f"{ESC}Xstring{ST}", "\\x1bXstring\\x1b\\"),
        ("8-bit CSI", "\x9b31mred", "\\x9b31mred"),
        ("8-bit OSC", "\x9d52;c;AAAA\x9c", "\\x9d52;c;AAAA\\x9c"),
        ("8-bit DCS", "\x90q\x9c", "\\x90q\\x9c"),
        ("C1 NEL", "a\x85b", "a\\x85b"),
        ("NUL", "a\x00b", "a\\x00b"),
        ("BEL", "ding\x07", "ding\\x07"),
        ("backspace", "passed\x08\x08\x08\x08\x08\x08failed", "passed" + "\\x08" * 6 + "failed"),
        ("vertical tab and form feed", "a\x0bb\x0cc", "a\\x0bb\\x0cc"),
        ("DEL", "a\x7fb", "a\\x7fb"),
        ("lone CR overwrites the line", "FAILED\rPASSED", "FAILED\\x0dPASSED"),
        ("CR at the very end", "x\r", "x\\x0d"),
        ("lone surrogate from undecodable bytes", "a\udcffb", "a\\udcffb"),
    ],
)
def test_sequences_are_made_visible(name: str, text: str, expected: str) -> None:
    assert neutralise(text) == expected, name
    assert not is_tty_safe(text)
    assert is_tty_safe(neutralise(text))


@pytest.mark.parametrize("char", [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))])
def test_bidi_controls_are_made_visible(char: str) -> None:
    # The "Trojan Source" set: embeddings, overrides and isolates.
    text = f"access = 'user{char} // admin'"
    assert neutralise(text) == f"access = 'user\\u{ord(char):04x} // admin'"
    assert not is_tty_safe(text)


@pytest.mark.parametrize(
    "text",
    [
        "café ✓ 日本",
        "line one\nline two\n",
        "col1\tcol2\r\n",
        "Ελληνικά, русский, العربية, עברית, हिन्दी, 한국어, emoji 🎉👍🏽",
        "zero\u200bwidth and a\u00a0non-breaking space",
        "a backslash \\x1b stays as it is",
        "",
    ],
)
def test_ordinary_text_is_untouched(text: str) -> None:
    assert neutralise(text) == text
    assert is_tty_safe(text)


def test_nothing_unsafe_survives() -> None:
    everything = "".join(chr(c) for c in range(0x3000)) + "".join(
        chr(c) for c in range(0xD800, 0xE000)
    )
    out = neutralise(everything)
    assert is_tty_safe(out)
    assert ESC not in out
    assert not any(0x80 <= ord(c) <= 0x9F for c in out)
    assert "\r" not in out
