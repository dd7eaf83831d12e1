"""Profiles: the built-ins, loading by name and path, and errors that point at the line.

Every profile here is a real file written into ``tmp_path``; nothing is mocked.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sandcell.errors import ConfigError
from sandcell.policy._profile_sections import DEFAULT_EXPORT_GLOBS
from sandcell.policy.profiles import (
    DEFAULT_PROFILE,
    STRICT_CEILINGS,
    FilesystemRules,
    LimitRules,
    Profile,
    ProfileError,
    RuntimeRules,
    builtin_names,
    default_profile_dir,
    host_problem,
    list_profiles,
    load_profile,
    parse_profile,
    render_list,
    render_matrix,
)
from sandcell.run_sockets import needs_sockets
from sandcell.spec import Limits, MiB


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def error_of(path: Path) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    return info.value


@pytest.fixture
def profile_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "profiles"
    folder.mkdir()
    return folder


# --------------------------------------------------------------------------------------------
# Built-ins


def test_builtins_are_shipped_with_strict_first() -> None:
    names = builtin_names()
    assert names[0] == DEFAULT_PROFILE == "strict"
    assert {"strict", "analysis", "supervised"} <= set(names)


@pytest.mark.parametrize("name", builtin_names())
def test_each_builtin_loads_and_its_matrix_renders(name: str, profile_dir: Path) -> None:
    profile = load_profile(name, profile_dir=profile_dir)
    assert profile.name == name
    assert profile.source == f"builtin:{name}"
    assert len(profile.sha256) == 64
    assert profile.description
    assert not needs_sockets(profile)  # every built-in stays network- and tool-free
    matrix = render_matrix(profile)
    assert f"profile {name} (builtin:{name})" in matrix
    for section in ("filesystem", "network", "limits", "runtime", "checks", "validation"):
        assert section in matrix
    assert "memory_mb" in matrix
    assert profile.to_record() == {
        "name": name,
        "source": f"builtin:{name}",
        "sha256": profile.sha256,
        "approval": profile.approval,
    }


def test_strict_is_exactly_what_absent_means(tmp_path: Path) -> None:
    strict = load_profile("strict", profile_dir=tmp_path)
    empty = parse_profile(b"", name="empty", source="empty.toml")
    for section in ("filesystem", "network", "limits", "runtime", "checks", "validation"):
        assert getattr(empty, section) == getattr(strict, section), section
    assert empty.approval == strict.approval == "on_findings"
    assert strict.filesystem.export_globs == DEFAULT_EXPORT_GLOBS
    assert strict.network.mode == "none"
    # What the run's runtime offers (the default runtime's analysis basics), nothing else
    # beyond the safe standard library.
    assert strict.import_allowlist() == frozenset({"@runtime"})
    assert strict.limits.defaults == Limits()
    assert strict.limits.ceilings == STRICT_CEILINGS


def test_analysis_and_supervised(tmp_path: Path) -> None:
    analysis = load_profile("analysis", profile_dir=tmp_path)
    assert analysis.allows_language("python")
    assert not analysis.allows_language("bash")
    assert analysis.import_allowlist() == frozenset({"@runtime"})
    assert analysis.allows_export("out/chart.png")
    assert analysis.limits.ceilings.wall_time_s == 120
    assert analysis.limits.ceilings.memory_bytes == 2048 * MiB
    supervised = load_profile("supervised", profile_dir=tmp_path)
    assert supervised.approval == "always"
    strict = load_profile("strict", profile_dir=tmp_path)
    assert supervised.filesystem == strict.filesystem
    assert supervised.limits == strict.limits


def test_the_default_is_strict(tmp_path: Path) -> None:
    assert load_profile(profile_dir=tmp_path).name == "strict"


# --------------------------------------------------------------------------------------------
# User profiles, names and paths

MINE = """\
description = "mine"
approval = "never"

[filesystem]
export_globs = ["out/*.txt"]

[limits]
wall_time_s = 5
"""


def test_user_profile_loads_by_name_and_by_path(profile_dir: Path) -> None:
    path = write(profile_dir, "mine.toml", MINE)
    by_name = load_profile("mine", profile_dir=profile_dir)
    by_path = load_profile(str(path))
    assert by_name == by_path
    assert by_name.name == "mine"
    assert by_name.source == str(path.resolve())
    assert by_name.approval == "never"
    assert by_name.limits.defaults.wall_time_s == 5
    assert by_name.limits.defaults.memory_bytes == Limits().memory_bytes  # absent: the default


def test_profile_dir_comes_from_the_environment(
    profile_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(profile_dir, "mine.toml", MINE)
    monkeypatch.setenv("SANDCELL_PROFILES", str(profile_dir))
    assert default_profile_dir() == profile_dir
    assert load_profile("mine").name == "mine"
    monkeypatch.delenv("SANDCELL_PROFILES")
    monkeypatch.setenv("SANDCELL_HOME", str(tmp_path / "home"))
    assert default_profile_dir() == tmp_path / "home" / "profiles"


def test_a_user_profile_cannot_shadow_a_builtin(profile_dir: Path) -> None:
    path = write(profile_dir, "strict.toml", MINE)
    with pytest.raises(ConfigError, match="shadows the built-in profile 'strict'"):
        load_profile("strict", profile_dir=profile_dir)
    with pytest.raises(ConfigError, match="cannot be shadowed"):
        load_profile(str(path))
    listed = {s.name: s for s in list_profiles(profile_dir) if s.source == str(path)}
    assert listed["strict"].problem is not None


def test_an_unknown_name_lists_the_available_ones(profile_dir: Path) -> None:
    write(profile_dir, "mine.toml", MINE)
    with pytest.raises(ConfigError) as info:
        load_profile("nosuch", profile_dir=profile_dir)
    message = str(info.value)
    assert "unknown profile 'nosuch'" in message
    for name in ("strict", "analysis", "supervised", "mine"):
        assert name in message


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_profile(str(tmp_path / "absent.toml"))


def test_list_profiles_shows_broken_ones_with_the_reason(profile_dir: Path) -> None:
    write(profile_dir, "mine.toml", MINE)
    write(profile_dir, "broken.toml", "[limits]\nmemroy_mb = 1\n")
    summaries = {s.name: s for s in list_profiles(profile_dir)}
    assert summaries["mine"].approval == "never"
    assert summaries["mine"].problem is None
    assert summaries["strict"].source == "builtin:strict"
    broken = summaries["broken"].problem
    assert broken is not None and "broken.toml:2:" in broken
    table = render_list(list(summaries.values()))
    assert "strict (default)" in table
    assert "UNUSABLE" in table


def test_sha256_is_of_the_file_and_changes_with_it(profile_dir: Path) -> None:
    path = write(profile_dir, "mine.toml", MINE)
    first = load_profile(str(path))
    assert first.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text(MINE.replace("wall_time_s = 5", "wall_time_s = 6"))
    second = load_profile(str(path))
    assert second.sha256 != first.sha256
    assert second.to_record()["sha256"] == second.sha256


# --------------------------------------------------------------------------------------------
# Errors name the file, the line and the reason


def test_unknown_key_points_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "p.toml", "# a comment\n\n[limits]\nwall_time_s = 10\nmemroy_mb = 100\n")
    err = error_of(path)
    assert err.line == 5
    assert err.path == str(path.resolve())
    assert "unknown key 'memroy_mb' in [limits]" in err.reason
    assert "memory_mb" in err.reason  # the known keys are listed
    assert str(err).startswith(f"{path.resolve()}:5: ")


def test_unknown_section_and_top_level_key(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, "a.toml", 'approval = "never"\n\n[netwrk]\nmode = "none"\n'))
    assert (err.line, "unknown key 'netwrk' at the top level") == (3, err.reason.split(";")[0])
    err = error_of(write(tmp_path, "b.toml", '\nname = "x"\n'))
    assert err.line == 2


def test_a_key_in_a_multiline_string_does_not_confuse_the_lines(tmp_path: Path) -> None:
    text = 'description = """\n[limits]\nmemroy_mb = 1\n"""\n\n[limits]\nmemroy_mb = 2\n'
    assert error_of(write(tmp_path, "p.toml", text)).line == 7


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "p.toml", "[limits]\nwall_time_s = 10\nmemory_mb = \n")
    err = error_of(path)
    assert err.line == 3
    assert str(err).startswith(f"{path.resolve()}:3: invalid TOML")
    err = error_of(write(tmp_path, "q.toml", 'description = "unterminated\n'))
    assert err.line == 1 and "invalid TOML" in err.reason


def test_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_bytes(b'description = "\xff"\n')
    assert "UTF-8" in error_of(path).reason


def test_wildcard_over_a_public_suffix_is_refused_at_its_line(tmp_path: Path) -> None:
    text = '[network]\nmode = "allowlist"\nhosts = [\n  "api.example.com",\n  "*.com",\n]\n'
    err = error_of(write(tmp_path, "p.toml", text))
    assert err.line == 5
    assert "not a host" in err.reason and "too broad" in err.reason


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("api.example.com", True),
        ("*.example.com", True),
        ("*.example.co.uk", True),
        ("*", False),
        ("*.com", False),
        ("*.co.uk", False),
        ("*.github.io", False),
        ("com", False),
        ("localhost", False),
        ("foo.*.example.com", False),
        ("api*.example.com", False),
        ("API.example.com", True),  # names are compared in lower case
        ("bücher.example", True),  # and as A-labels (IDNA)
        ("10.0.0.1", True),  # an IP literal, allowed when listed explicitly
        ("[2001:db8::1]:443", True),
        ("api.example.com:443,8443", True),
        ("api.example.com:0", False),
        ("api.example.com:https", False),
        ("1.2.3", False),
        ("exa_mple.com", False),
    ],
)
def test_host_problem(host: str, ok: bool) -> None:
    problem = host_problem(host)
    assert (problem is None) is ok, problem
    if not ok:
        assert problem is not None and "not a host" in problem


def test_hosts_with_mode_none_are_refused(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, "p.toml", '[network]\nhosts = ["api.example.com"]\n'))
    assert err.line == 2 and "mode is 'none'" in err.reason


def test_a_limit_above_its_ceiling_in_the_file_is_refused(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, "p.toml", "[limits]\nwall_time_s = 10\nmemory_mb = 2048\n"))
    assert err.line == 3
    assert "memory_bytes" in err.reason and "ceiling of 1 GiB" in err.reason
    # With no [limits] key, the ceiling that is too low is the line to fix.
    err = error_of(write(tmp_path, "q.toml", "[ceilings]\n\nwall_time_s = 10\n"))
    assert err.line == 3 and "default of 30 s" in err.reason


def test_limits_below_the_floor_are_refused(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, "p.toml", "[limits]\nmax_pids = 4\nmemory_mb = 8\n"))
    assert err.line == 3 and "16 MiB" in err.reason
    err = error_of(write(tmp_path, "q.toml", "[ceilings]\nmax_pids = 0\n"))
    assert err.line == 2 and "positive" in err.reason


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('[filesystem]\nmax_inputs = "8"\n', 2, "must be an integer"),
        ("[limits]\nwall_time_s = true\n", 2, "must be a number"),
        ('[runtime]\nlanguages = [\n  "python",\n  "ruby",\n]\n', 4, "unknown language"),
        ('[runtime]\nallowed_imports = ["os.path"]\n', 2, "top-level module"),
        ('[runtime]\nruntime = "GPU"\n', 2, "is not a runtime name"),
        ('[filesystem]\nexport_globs = ["ok/*.png", "../up"]\n', 2, "'..'"),
        ('\n\napproval = "sometimes"\n', 3, "unknown approval"),
        ('[network]\nmode = "open"\n', 2, "unknown network mode"),
        ('[checks]\ndisabled = [\n  "py.process",\n  "PROCESS",\n]\n', 4, "not a rule id"),
        ('[checks.severity]\n"py.process" = "warning"\n"py.eval" = "fatal"\n', 3, "severity"),
        ('[checks]\ndisabled = ["py.x"]\n[checks.severity]\n"py.x" = "deny"\n', 4, "both"),
        ("filesystem = 3\n", 1, "must be a table"),
        ('[validation]\nresult_file = "../r.json"\n', 2, "'..'"),
        ("[validation.result_schema]\ntype = 5\n", 1, "not a valid JSON Schema"),
    ],
)
def test_semantic_errors_point_at_the_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    err = error_of(write(tmp_path, "p.toml", text))
    assert err.line == line, err
    assert words in err.reason, err


def test_result_schema_inline_and_from_a_file(tmp_path: Path) -> None:
    inline = '[validation]\nresult_file = "out/result.json"\n[validation.result_schema]\n'
    inline += 'type = "object"\nrequired = ["answer"]\n'
    profile = load_profile(str(write(tmp_path, "inline.toml", inline)))
    assert profile.validation.result_schema == {"type": "object", "required": ["answer"]}
    assert profile.validation.result_file == "out/result.json"

    schema = write(tmp_path, "schema.json", json.dumps({"type": "number"}))
    path = write(tmp_path, "linked.toml", '[validation]\nresult_schema_file = "schema.json"\n')
    first = load_profile(str(path))
    assert first.validation.result_schema == {"type": "number"}
    schema.write_text(json.dumps({"type": "string"}))
    assert load_profile(str(path)).sha256 != first.sha256  # the schema is part of the content

    schema.write_text("{not json")
    err = error_of(path)
    assert err.line == 2 and "not JSON" in err.reason
    both = '[validation]\nresult_schema_file = "schema.json"\nresult_schema = {type = "object"}\n'
    assert "not both" in error_of(write(tmp_path, "both.toml", both)).reason


# --------------------------------------------------------------------------------------------
# Empty versus absent, and the queries


def test_empty_denies_and_absent_takes_the_default(tmp_path: Path) -> None:
    empty = load_profile(
        str(write(tmp_path, "empty.toml", "[filesystem]\nexport_globs = []\nmax_inputs = 0\n"))
    )
    absent = load_profile(str(write(tmp_path, "absent.toml", "")))
    for glob in ("out/a.png", "a.png", "**", "*"):
        assert not empty.allows_export(glob)
    # Absent takes strict's default: out/ and result files at the top, nothing wider.
    assert absent.allows_export("out/a.png") and absent.allows_export("a.png")
    assert not absent.allows_export("**") and not absent.allows_export("*")
    assert absent.filesystem == FilesystemRules()
    assert not empty.allows_inputs(1)
    assert absent.allows_inputs(8) and not absent.allows_inputs(9)

    no_languages = load_profile(str(write(tmp_path, "nolang.toml", "[runtime]\nlanguages = []\n")))
    assert not no_languages.allows_language("python")
    assert not no_languages.allows_language("bash")
    assert absent.allows_language("python") and absent.allows_language("bash")
    assert absent.runtime == RuntimeRules()


def test_javascript_and_typescript_are_allowed_where_a_profile_names_them(tmp_path: Path) -> None:
    # The general profiles (and absent, which is strict's list) run every language; the
    # analysis profiles and pure (the wasm rung's) are Python's; a profile may name them.
    for name in ("strict", "supervised", "hostile", "absent"):
        profile = load_profile(
            str(write(tmp_path, "absent.toml", "")) if name == "absent" else name
        )
        assert profile.allows_language("javascript"), name
        assert profile.allows_language("typescript"), name
    for name in ("analysis", "datascience", "pure"):
        profile = load_profile(name)
        assert not profile.allows_language("javascript"), name
        assert not profile.allows_language("typescript"), name
    unchecked = load_profile("unchecked")
    assert unchecked.runtime.languages == ("python", "bash", "javascript", "typescript")
    # "No static check runs": every rule of every language, JavaScript's included.
    from sandcell.policy.checks.findings import RULES

    assert set(RULES) <= set(unchecked.checks.disabled)
    node = load_profile(
        str(write(tmp_path, "node.toml", '[runtime]\nlanguages = ["javascript"]\n'))
    )
    assert node.allows_language("javascript") and not node.allows_language("typescript")
    assert not node.allows_language("python")


ANALYSIS_GLOBS = ("out/**", "*.png", "*.csv", "*.json")


@pytest.mark.parametrize(
    ("glob", "allowed"),
    [
        ("out/chart.png", True),
        ("out/**", True),
        ("out/sub/*.csv", True),
        ("./out/a.txt", True),
        ("chart.png", True),
        ("*.png", True),
        ("a*.png", True),
        ("data.txt", False),
        ("*", False),
        ("**", False),
        ("**/*.png", False),
        ("sub/chart.png", False),
        ("*.png/x", False),
    ],
)
def test_allows_export(glob: str, allowed: bool) -> None:
    profile = Profile(
        name="t", source="t", sha256="", filesystem=FilesystemRules(export_globs=ANALYSIS_GLOBS)
    )
    assert profile.allows_export(glob) is allowed


def test_allows_export_is_conservative_with_wildcards() -> None:
    profile = Profile(
        name="t", source="t", sha256="", filesystem=FilesystemRules(export_globs=("?.png",))
    )
    assert profile.allows_export("a.png")
    assert not profile.allows_export("*.png")  # '*.png' also matches 'ab.png'
    with pytest.raises(ConfigError):
        profile.allows_export("../etc/passwd")


def test_limits_for_applies_defaults_and_refuses_above_the_ceiling(tmp_path: Path) -> None:
    strict = load_profile("strict", profile_dir=tmp_path)
    assert strict.limits_for() == Limits()
    assert strict.limits_for({"wall_time_s": None}) == Limits()
    assert strict.limits_for({"wall_time_s": 45, "memory_bytes": None}).wall_time_s == 45
    assert strict.limits_for({"memory_bytes": 1024 * MiB}).memory_bytes == 1024 * MiB  # at
    with pytest.raises(ConfigError) as info:
        strict.limits_for({"memory_bytes": 2048 * MiB})
    message = str(info.value)
    for part in ("memory_bytes", str(2048 * MiB), str(1024 * MiB), "'strict'", "ceiling"):
        assert part in message
    with pytest.raises(ConfigError, match="wall_time_s=61"):
        strict.limits_for({"wall_time_s": 61})
    with pytest.raises(ConfigError, match="unknown limit 'memory_mb'"):
        strict.limits_for({"memory_mb": 1})
    # NaN compares false with the ceiling, infinity used to crash the ceiling's message.
    with pytest.raises(ConfigError, match="wall_time_s must be a finite number, got nan"):
        strict.limits_for({"wall_time_s": float("nan")})
    with pytest.raises(ConfigError, match="memory_bytes must be a finite number, got inf"):
        strict.limits_for({"memory_bytes": float("inf")})


def test_limit_rules_refuse_defaults_above_ceilings() -> None:
    with pytest.raises(ConfigError, match="above its ceiling"):
        LimitRules(defaults=Limits(wall_time_s=100))


def test_allowlist_loads_and_gets_run_sockets(tmp_path: Path) -> None:
    text = '[network]\nmode = "allowlist"\nhosts = ["api.example.com", "*.example.org"]\n'
    profile = load_profile(str(write(tmp_path, "net.toml", text)))
    assert profile.network.hosts == ("api.example.com", "*.example.org")
    assert profile.allows_network()
    assert needs_sockets(profile)
    assert "api.example.com" in render_matrix(profile)


def test_import_allowlist(tmp_path: Path) -> None:
    anything = load_profile(
        str(write(tmp_path, "any.toml", '[runtime]\nallowed_imports = ["*"]\n'))
    )
    assert anything.import_allowlist() is None
    some = load_profile(str(write(tmp_path, "some.toml", '[runtime]\nallowed_imports = ["x"]\n')))
    assert some.import_allowlist() == frozenset({"x"})


def test_checks_section(tmp_path: Path) -> None:
    text = '[checks]\ndisabled = ["sh.network-tool"]\n[checks.severity]\n"py.process" = "deny"\n'
    profile = load_profile(str(write(tmp_path, "c.toml", text)))
    assert profile.checks.disabled == ("sh.network-tool",)
    assert dict(profile.checks.severity) == {"py.process": "deny"}
    assert "py.process=deny" in render_matrix(profile)


def test_tools_load_and_allow_their_client(tmp_path: Path) -> None:
    text = (
        '[tools.weather]\nkind = "http"\nbase_url = "https://api.example.com/v1"\n'
        'allow = ["GET /forecast/*"]\ncredential_env = "WEATHER_API_KEY"\n'
    )
    profile = load_profile(str(write(tmp_path, "tools.toml", text)))
    assert [t.name for t in profile.tools] == ["weather"]
    assert needs_sockets(profile)
    allowed = profile.import_allowlist()
    assert allowed is not None and "sandcell_tools" in allowed


def test_network_caps_reach_the_proxy_and_bad_ones_are_refused(tmp_path: Path) -> None:
    text = (
        '[network]\nmode = "allowlist"\nhosts = ["api.example.com"]\n'
        "max_connections = 5\nmax_concurrent = 2\nmax_mb_up = 1\nmax_mb_down = 3\n"
    )
    profile = load_profile(str(write(tmp_path, "caps.toml", text)))
    net = profile.network
    assert (net.max_connections, net.max_concurrent, net.max_mb_up, net.max_mb_down) == (5, 2, 1, 3)
    assert "5 connections (2 at once), 1 MiB up, 3 MiB down" in render_matrix(profile)
    bad = text.replace("max_concurrent = 2", "max_concurrent = 0")
    with pytest.raises(ConfigError, match=r"caps2.toml:5: .*max_concurrent must be an integer"):
        load_profile(str(write(tmp_path, "caps2.toml", bad)))


def test_network_resolve_entries_are_the_proxys_own_hosts(tmp_path: Path) -> None:
    import ipaddress

    text = (
        '[network]\nmode = "allowlist"\nhosts = ["mirror.corp.example"]\n'
        'resolve = ["Mirror.Corp.Example=10.1.2.3, 10.1.2.4"]\nallow_addresses = ["10.1.0.0/16"]\n'
    )
    profile = load_profile(str(write(tmp_path, "res.toml", text)))
    assert dict(profile.network.static_hosts) == {
        "mirror.corp.example": (ipaddress.ip_address("10.1.2.3"), ipaddress.ip_address("10.1.2.4"))
    }
    for bad, why in (
        ('resolve = ["mirror.corp.example"]', "give it as name=address"),
        ('resolve = ["mirror.corp.example=not-an-ip"]', "is not a list of IP addresses"),
        ('resolve = ["localhost=127.0.0.1"]', "'localhost' is not a host"),
    ):
        wrong = text.replace('resolve = ["Mirror.Corp.Example=10.1.2.3, 10.1.2.4"]', bad)
        with pytest.raises(ConfigError, match=why):
            load_profile(str(write(tmp_path, "bad.toml", wrong)))
    off = '[network]\nmode = "none"\nresolve = ["a.example.com=10.0.0.1"]\n'
    with pytest.raises(ConfigError, match="resolve entries are listed but mode is 'none'"):
        load_profile(str(write(tmp_path, "off.toml", off)))
