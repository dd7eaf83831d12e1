"""The leak scan: each pattern on a realistic sample, false positives, known secrets, idempotence.

Every secret-shaped string here is assembled at run time from parts and pseudo-random
characters, so the repository itself holds nothing a secret scanner would flag.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import uuid

import pytest

from sandcell.validation import Redactor
from sandcell.validation.redact import MIN_SECRET_CHARS

ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"


def _rand(n: int, alphabet: str = ALNUM, seed: int = 0) -> str:
    rng = random.Random(f"{seed}-{n}-{alphabet}")
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _jwt() -> str:
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = _b64url(json.dumps({"sub": "1234567890", "name": "Ada", "iat": 1516239022}).encode())
    return f"{header}.{payload}.{_rand(43, B64URL)}"


def _pem(label: str = "RSA PRIVATE KEY") -> str:
    body = "\n".join(_rand(64, ALNUM + "+/", seed=i) for i in range(5))
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----"


# (kind, the secret itself, the text it appears in)
SAMPLES: list[tuple[str, str, str]] = [
    ("aws_access_key_id", "AKIA" + "IOSFODNN7" + "EXAMPLE", "aws_access_key_id = {}"),
    ("aws_access_key_id", "ASIA" + _rand(16, string.ascii_uppercase + string.digits), "id={}"),
    (
        "aws_secret_access_key",
        "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY",
        "aws_secret_access_key = {}",
    ),
    ("aws_secret_access_key", _rand(40, ALNUM + "/+"), '"SecretAccessKey": "{}",'),
    ("github_token", "ghp_" + _rand(36), "export GITHUB_TOKEN={}"),
    ("github_token", "gho_" + _rand(36), "token {} in log"),
    ("github_token", "ghs_" + _rand(36), "x-access-token {}"),
    ("github_token", "github_pat_" + _rand(22) + "_" + _rand(59), "pat: {}"),
    ("gitlab_token", "glpat-" + _rand(20, B64URL), "PRIVATE-TOKEN: {}"),
    ("slack_token", "xoxb-" + "123456789012-1234567890123-" + _rand(24), "SLACK={}"),
    ("stripe_key", "sk_" + "live_" + _rand(24), "stripe.api_key = '{}'"),
    ("stripe_key", "rk_" + "live_" + _rand(24), "{}"),
    ("openai_key", "sk-" + "proj-" + _rand(48, B64URL), "OPENAI_API_KEY={}"),
    ("openai_key", "sk-" + _rand(20) + "T3Blbk" + "FJ" + _rand(20), "key: {}"),
    ("anthropic_key", "sk-" + "ant-" + "api03-" + _rand(93, B64URL) + "AA", "x-api-key: {}"),
    ("google_api_key", "AIza" + "Sy" + _rand(33, B64URL), "https://maps.example/api?key={}&q=1"),
    ("jwt", _jwt(), "Cookie: session={}; Path=/"),
    ("private_key", _pem(), "{}\n"),
    ("private_key", _pem("OPENSSH PRIVATE KEY"), "key:\n{}\n"),
    ("private_key", _pem("PRIVATE KEY"), "{}"),
    ("private_key", _pem("PGP PRIVATE KEY BLOCK"), "{}"),
    (
        "url_credentials",
        "s3cr3t" + "Passw0rd",
        "DATABASE_URL=postgres://admin:{}@db.internal:5432/app",
    ),
    ("url_credentials", "p%40ss" + "w0rd!", "https://bob:{}@example.com/"),
    ("authorization_header", _rand(40, B64URL + "."), "Authorization: Bearer {}"),
    ("authorization_header", _rand(32, ALNUM), '"authorization": "token {}"'),
    ("secret_assignment", "Summer2024" + "!xyzzy", "password=Summer2024!xyzzy"),
    ("secret_assignment", _rand(24), "DB_PASSWORD={}"),
    ("secret_assignment", _rand(32), '{{"api_key": "{}"}}'),
    ("secret_assignment", _rand(20), "client_secret: {}"),
    ("secret_assignment", _rand(30), "--auth-token={} --verbose"),
]


@pytest.mark.parametrize(("kind", "secret", "template"), SAMPLES)
def test_each_pattern_is_found_and_redacted(kind: str, secret: str, template: str) -> None:
    text = template.format(secret) if "{}" in template else template
    assert secret in text
    redacted, leaks = Redactor().scan_text(text)
    assert secret not in redacted
    assert f"[REDACTED:{kind}]" in redacted
    assert len(leaks) == 1
    leak = leaks[0]
    assert leak.kind == kind
    assert leak.severity == ("warning" if kind == "secret_assignment" else "secret")
    assert text[leak.start : leak.end] == secret
    # The preview identifies the secret without giving it away.
    assert "…" in leak.preview
    shown = leak.preview.replace("…", "")
    assert len(shown) < len(secret) / 2 or len(secret) - len(shown) >= 16


def test_context_around_a_secret_is_kept() -> None:
    secret = "s3cr3t" + "Passw0rd"
    text = f"url=postgres://admin:{secret}@db.internal:5432/app ok"
    redacted, _ = Redactor().scan_text(text)
    assert redacted == "url=postgres://admin:[REDACTED:url_credentials]@db.internal:5432/app ok"


def test_preview_shows_public_prefix_and_last_four() -> None:
    token = "ghp_" + _rand(36)
    _, leaks = Redactor().scan_text(f"t={token}")
    assert leaks[0].preview == f"ghp_…{token[-4:]}"
    _, leaks = Redactor().scan_text(_pem())
    assert leaks[0].preview == "-----BEGIN RSA PRIVATE KEY-----…"


def test_lines_and_offsets() -> None:
    token = "ghp_" + _rand(36)
    text = f"one\ntwo {token}\nthree\n{token}"
    _, leaks = Redactor().scan_text(text)
    assert [(leak.line, leak.start) for leak in leaks] == [(2, 8), (4, text.rindex(token))]


def test_a_truncated_private_key_is_still_redacted() -> None:
    # Output cut at a limit has no END line: the whole body goes.
    pem = _pem()
    cut = pem[: len(pem) // 2]
    redacted, leaks = Redactor().scan_text(f"{cut}")
    assert redacted == "[REDACTED:private_key]"
    assert leaks[0].kind == "private_key"


def test_a_private_key_inside_json_keeps_the_json_valid() -> None:
    line = json.dumps({"key": _pem(), "n": 1})
    redacted, leaks = Redactor().scan_text(line)
    assert [leak.kind for leak in leaks] == ["private_key"]
    assert json.loads(redacted) == {"key": "[REDACTED:private_key]", "n": 1}


# --------------------------------------------------------------------------------------------
# False positives


@pytest.mark.parametrize(
    "text",
    [
        hashlib.sha1(b"sandcell").hexdigest(),
        "commit " + hashlib.sha256(b"x").hexdigest(),
        str(uuid.UUID(int=0x1234_5678_9ABC_DEF0_1234_5678_9ABC_DEF0)),
        "data:image/png;base64," + base64.b64encode(random.Random(1).randbytes(600)).decode(),
        "Please enter your password: it must be at least 12 characters long.",
        "The password field is required; forgot your password? Reset password here.",
        "password = settings.database_password",
        "token=None",
        "password: ${DB_PASSWORD}",
        "api_key=os.environ['API_KEY']",
        "the secret: revealed at last",
        "postgres://user:****@localhost/db",
        "https://example.com:8080/path@x",
        "ssh://git@github.com/org/repo.git",
        "sk-" + "abc",
        "pwd: /home/user12345678",
        "token_type=bearer next_page_token=abc",
        "aws_secret_access_key = <your secret key>",
        "AKIA" + "short",
        "the mask is gho_" + "x" * 10,
    ],
)
def test_no_false_positives(text: str) -> None:
    redacted, leaks = Redactor().scan_text(text)
    assert leaks == ()
    assert redacted == text


def test_token_inside_a_longer_word_is_not_a_token() -> None:
    embedded = "x" + "AKIA" + "IOSFODNN7" + "EXAMPLE" + "9"
    assert Redactor().scan_text(embedded)[1] == ()


# --------------------------------------------------------------------------------------------
# Known secrets


def test_known_secret_exact_match() -> None:
    secret = "correct-horse-" + "battery-staple"
    redacted, leaks = Redactor(known_secrets=[secret]).scan_text(f"db pass is {secret}.")
    assert redacted == "db pass is [REDACTED:known_secret]."
    assert leaks[0].kind == "known_secret"
    assert leaks[0].preview == "…" + secret[-4:]


@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_known_secret_in_base64(encode: object) -> None:
    secret = "hunter2" + "-is-my-password?"
    assert callable(encode)
    encoded = encode(secret.encode()).decode()
    redacted, leaks = Redactor(known_secrets=[secret]).scan_text(f"blob={encoded}")
    assert encoded not in redacted
    assert [leak.kind for leak in leaks] == ["known_secret_base64"]


@pytest.mark.parametrize("user", ["", "a", "ab", "admin"])
def test_known_secret_in_basic_auth_at_any_alignment(user: str) -> None:
    secret = "hunter2" + "hunter2-long"
    header = "Authorization: Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
    redacted, leaks = Redactor(known_secrets=[secret]).scan_text(header)
    assert leaks
    # What is left of the base64 cannot carry more than the edges of the secret.
    leftover = redacted.split("Basic ", 1)[1].replace("[REDACTED:known_secret_base64]", "")
    leftover = leftover.replace("[REDACTED:authorization_header]", "")
    assert len(leftover) <= 8


def test_short_known_secrets_are_ignored() -> None:
    short = "x" * (MIN_SECRET_CHARS - 1)
    assert Redactor(known_secrets=[short, " " * 20]).scan_text(f"{short} and more")[1] == ()


def test_longest_known_secret_wins() -> None:
    redacted, leaks = Redactor(known_secrets=["abcdefgh", "abcdefghijkl"]).scan_text(
        "[abcdefghijkl]"
    )
    assert redacted == "[[REDACTED:known_secret]]"
    assert len(leaks) == 1


# --------------------------------------------------------------------------------------------
# Idempotence and encodings


def _everything() -> str:
    parts = [template.format(secret) for _, secret, template in SAMPLES]
    return "\n".join(["café ✓ 日本", *parts, "known hunter2hunter2 end"])


def test_redaction_is_idempotent() -> None:
    redactor = Redactor(known_secrets=["hunter2hunter2"])
    once, leaks = redactor.scan_text(_everything())
    assert len(leaks) >= len(SAMPLES) + 1
    twice, again = redactor.scan_text(once)
    assert twice == once
    assert again == ()


def test_a_redaction_that_frees_a_neighbouring_token_is_followed_through() -> None:
    # The known secret glues onto an AWS key id; once it is redacted, the key id stands alone
    # and must go too, in the same scan, so that a second scan finds nothing.
    key_id = "AKIA" + "IOSFODNN7" + "EXAMPLE"
    secret = "zzsecretvalue1"
    redactor = Redactor(known_secrets=[secret])
    once, leaks = redactor.scan_text(f"{secret}{key_id} end")
    assert once == "[REDACTED:known_secret][REDACTED:aws_access_key_id] end"
    assert [(leak.kind, leak.start) for leak in leaks] == [
        ("known_secret", 0),
        ("aws_access_key_id", len(secret)),
    ]
    assert redactor.scan_text(once) == (once, ())


def test_markers_in_the_input_are_left_alone() -> None:
    text = "already [REDACTED:github_token] here"
    assert Redactor(known_secrets=["REDACTED:github"]).scan_text(text) == (text, ())


def test_bytes_keep_every_other_byte_and_utf8() -> None:
    token = "ghp_" + _rand(36)
    secret = "hunter2hunter2"
    data = b"\xff\xfe caf\xc3\xa9 " + token.encode() + " 日本 ".encode() + secret.encode() + b"\x00"
    redacted, leaks = Redactor(known_secrets=[secret]).scan_bytes(data)
    assert redacted == (
        b"\xff\xfe caf\xc3\xa9 [REDACTED:github_token]"
        + " 日本 ".encode()
        + b"[REDACTED:known_secret]\x00"
    )
    # Offsets are byte offsets.
    assert [data[leak.start : leak.end] for leak in leaks] == [token.encode(), secret.encode()]


def test_text_and_bytes_agree() -> None:
    redactor = Redactor(known_secrets=["hunter2hunter2"])
    text = _everything()
    redacted_text, text_leaks = redactor.scan_text(text)
    redacted_bytes, byte_leaks = redactor.scan_bytes(text.encode())
    assert redacted_bytes == redacted_text.encode()
    assert [leak.kind for leak in byte_leaks] == [leak.kind for leak in text_leaks]


def test_a_known_secret_with_non_ascii_characters() -> None:
    secret = "pässwörd-日本-secret"
    redacted, leaks = Redactor(known_secrets=[secret]).scan_bytes(f"x {secret} y".encode())
    assert redacted == b"x [REDACTED:known_secret] y"
    assert leaks[0].kind == "known_secret"


def test_nothing_to_redact_returns_the_input() -> None:
    data = bytes(range(256)) * 4
    assert Redactor().scan_bytes(data) == (data, ())


def test_custom_patterns() -> None:
    import re

    from sandcell.errors import ConfigError
    from sandcell.validation import DEFAULT_PATTERNS, Pattern

    internal = Pattern(kind="acme_key", regex=re.compile(r"(?P<public>acme_)[0-9a-f]{32}"))
    redactor = Redactor(patterns=(*DEFAULT_PATTERNS, internal))
    key = "acme_" + _rand(32, "0123456789abcdef")
    redacted, leaks = redactor.scan_text(f"k={key}")
    assert redacted == "k=[REDACTED:acme_key]"
    assert leaks[0].preview == f"acme_…{key[-4:]}"
    assert redactor.scan_bytes(f"k={key}".encode())[0] == b"k=[REDACTED:acme_key]"
    with pytest.raises(ConfigError, match="lower-case"):
        Pattern(kind="Bad Kind", regex=re.compile("x"))
    with pytest.raises(ConfigError, match="write it in ASCII"):
        Redactor(patterns=[Pattern(kind="x", regex=re.compile("ключ"))])
