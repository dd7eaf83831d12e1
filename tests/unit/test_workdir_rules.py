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
