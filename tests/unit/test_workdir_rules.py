"""The profile's ``[workdir]`` section: the patch workflow's choices, checked when loaded."""

from __future__ import annotations

import pytest

from sandcell.policy.profiles import ProfileError, load_profile, parse_profile


def test_binary_changes_default_to_refused() -> None:
    assert load_profile("strict").workdir.binary_changes == "refuse"
    assert load_profile("unchecked").workdir.binary_changes == "refuse"
    allowed = parse_profile(b'[workdir]\nbinary_changes = "allow"\n', name="p", source="p.toml")
    assert allowed.workdir.binary_changes == "allow"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b'[workdir]\nbinary_changes = "yes"\n', r"p\.toml:2: unknown binary_changes 'yes'"),
        (b"[workdir]\nbinary = 1\n", "binary"),
    ],
)
def test_bad_workdir_settings_name_the_line(body: bytes, match: str) -> None:
    with pytest.raises(ProfileError, match=match):
        parse_profile(body, name="p", source="p.toml")


def test_leave_out_names_files_not_paths() -> None:
    rules = parse_profile(b'[workdir]\nleave_out = ["*.pem"]\n', name="p", source="p.toml")
    assert rules.workdir.leave_out == ("*.pem",)
    assert ".env" in load_profile("strict").workdir.leave_out
    with pytest.raises(ProfileError, match=r"p\.toml:2: leave_out 'a/b'"):
        parse_profile(b'[workdir]\nleave_out = ["a/b"]\n', name="p", source="p.toml")


CONFIG = b"""[core]
\trepositoryformatversion = 0
[remote "origin"]
\turl = https://x-access-token:SEKRIT1@github.example/o/r.git
\tpushurl = ssh://deploy:SEKRIT2@git.example/o/r.git
\tfetch = +refs/heads/*:refs/remotes/origin/*
[remote "mirror"]
\turl = ssh://git@git.example/o/r.git
[url "https://SEKRIT3@github.example/"]
\tinsteadOf = https://github.example/
[credential]
\thelper = store --file /home/me/SEKRIT4
[credential "https://git.example"]
\tusername = SEKRIT5
[http "https://github.example/"]
\textraheader = AUTHORIZATION: basic SEKRIT6
[branch "main"]
\tremote = origin
"""


def test_git_config_is_copied_without_credentials() -> None:
    from sandcell.changes.credentials import describe, scrub_git_config

    scrubbed, removed = scrub_git_config(CONFIG)
    assert b"SEKRIT" not in scrubbed
    assert b"url = https://github.example/o/r.git" in scrubbed
    assert b"ssh://git@git.example/o/r.git" in scrubbed  # a user name alone over ssh is kept
    assert b'[branch "main"]\n\tremote = origin\n' in scrubbed
    assert describe(removed) == (
        "copied without 3 x the user and password of a URL, 2 x a [credential] section, "
        "an extraheader"
    )
    assert scrub_git_config(b"[core]\n\tbare = false\n") == (b"[core]\n\tbare = false\n", [])
