"""Model configuration: precedence of flags, environment and config file; scripted models; the
messages a user sees when something is missing. No request is made: adapters are only built."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import pytest

from sandcell.errors import ConfigError, ModelError
from sandcell.models import ModelSettings, parse_spec, resolve_model, resolve_model_and_settings
from sandcell.models.base import Message, Model
from sandcell.models.fake import ScriptedModel
from sandcell.models.openai_chat import OpenAIChatModel

SECRET = "sk-very-secret-0123456789"


class Resolve(Protocol):
    def __call__(
        self,
        spec: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        config: str | None = None,
        **kw: Any,
    ) -> tuple[Model, ModelSettings]: ...


@pytest.fixture
def resolve(tmp_path: Path) -> Iterator[Resolve]:
    """``resolve(spec, *, env=..., config=..., **kw) -> (model, settings)``; closes the clients."""
    built: list[Model] = []

    def run(
        spec: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        config: str | None = None,
        **kw: Any,
    ) -> tuple[Model, ModelSettings]:
        path = tmp_path / "config.toml"
        if config is not None:
            path.write_text(config)
        model, settings = resolve_model_and_settings(
            spec,
            environ=dict(env or {}),
            config_file=path if config is not None else tmp_path / "none.toml",
            **kw,
        )
        built.append(model)
        return model, settings

    # A missing explicit config file is an error; tests without a file use an empty one.
    (tmp_path / "none.toml").write_text("")
    yield run
    for model in built:
        close = getattr(model, "close", None)
        if close:
            close()


FILE = """
[model]
name = "openai:gpt-from-file"
base_url = "http://file.example/v1"
api_key_env = "FILE_KEY"
timeout_s = 42
max_tokens = 1234
"""


def test_flag_beats_env_beats_file(resolve: Resolve) -> None:
    env = {"SANDCELL_MODEL": "openai:gpt-from-env", "FILE_KEY": "k", "OPENAI_API_KEY": "k2"}
    _, s = resolve("openai:gpt-from-flag", env=env, config=FILE)
    assert (s.name, s.source("name")) == ("openai:gpt-from-flag", "argument")
    _, s = resolve(None, env=env, config=FILE)
    assert (s.name, s.source("name")) == ("openai:gpt-from-env", "env SANDCELL_MODEL")
    _, s = resolve(None, env={"FILE_KEY": "k"}, config=FILE)
    assert s.name == "openai:gpt-from-file"
    assert s.source("name").startswith("config ") and s.source("name").endswith("config.toml")
    # Values the flag and env do not set still come from the file.
    assert (s.timeout_s, s.max_tokens, s.api_key_env) == (42.0, 1234, "FILE_KEY")


def test_base_url_precedence(resolve: Resolve) -> None:
    env = {"OPENAI_BASE_URL": "http://env.example/v1", "FILE_KEY": "k"}
    _, s = resolve(None, env=env, config=FILE, base_url="http://flag.example/v1/")
    assert (s.base_url, s.source("base_url")) == ("http://flag.example/v1", "argument")
    _, s = resolve(None, env=env, config=FILE)
    assert (s.base_url, s.source("base_url")) == ("http://env.example/v1", "env OPENAI_BASE_URL")
    _, s = resolve(None, env={"FILE_KEY": "k"}, config=FILE)
    assert s.base_url == "http://file.example/v1"
    _, s = resolve("openai:gpt-4o-mini", env={"OPENAI_API_KEY": "k"})
    assert (s.base_url, s.source("base_url")) == ("https://api.openai.com/v1", "default")


def test_key_and_timeout_precedence(resolve: Resolve) -> None:
    env = {"FILE_KEY": "from-env"}
    _, s = resolve(None, env=env, config=FILE, api_key=SECRET, timeout_s=5)
    assert (s.source("api_key"), s.api_key_env) == ("argument", None)
    assert (s.timeout_s, s.source("timeout_s")) == (5.0, "argument")
    _, s = resolve(None, env=env, config=FILE)
    assert (s.source("api_key"), s.api_key_env) == ("env FILE_KEY", "FILE_KEY")
    _, s = resolve("anthropic:claude-x", env={"ANTHROPIC_API_KEY": "k"})
    assert (s.timeout_s, s.source("timeout_s")) == (300.0, "default")
    assert (s.base_url, s.api_key_env) == ("https://api.anthropic.com", "ANTHROPIC_API_KEY")


def test_file_endpoint_applies_only_to_its_provider(resolve: Resolve) -> None:
    _, s = resolve("anthropic:claude-x", env={"ANTHROPIC_API_KEY": "k"}, config=FILE)
    assert s.base_url == "https://api.anthropic.com"
    assert s.api_key_env == "ANTHROPIC_API_KEY"
    # Provider-neutral settings still apply.
    assert s.timeout_s == 42.0


def test_file_without_name_still_sets_endpoint(resolve: Resolve) -> None:
    config = '[model]\nbase_url = "http://localhost:8000/v1"\n'
    model, s = resolve("openai-compatible:qwen", config=config)
    assert isinstance(model, OpenAIChatModel)
    assert (s.base_url, s.source("api_key")) == ("http://localhost:8000/v1", "none (not sent)")


def test_adapters_built_for_each_provider(resolve: Resolve) -> None:
    model, s = resolve("openai:gpt-4o-mini", env={"OPENAI_API_KEY": "k"})
    assert isinstance(model, OpenAIChatModel)
    assert model.name == s.name == "openai:gpt-4o-mini"
    # The official API wants the new name for the output limit; compatible servers the old one.
    assert model.limit_param == "max_completion_tokens"
    model, _ = resolve("openai:gpt-4o-mini", env={"OPENAI_API_KEY": "k"}, base_url="http://x/v1")
    assert isinstance(model, OpenAIChatModel)
    assert model.limit_param == "max_tokens"
    model, s = resolve("openai-compatible:llama3:8b", base_url="http://localhost:11434/v1")
    assert (s.provider, s.model, model.name) == (
        "openai-compatible",
        "llama3:8b",
        "openai-compatible:llama3:8b",
    )
    model, _ = resolve("anthropic:claude-x", env={"ANTHROPIC_API_KEY": "k"})
    assert type(model).__name__ == "AnthropicMessagesModel"
    assert model.name == "anthropic:claude-x"


def test_scripted_model(resolve: Resolve, tmp_path: Path) -> None:
    script = tmp_path / "turns.json"
    script.write_text(json.dumps(["first", "second"]))
    model, s = resolve(f"scripted:{script}")
    assert isinstance(model, ScriptedModel)
    assert (s.provider, s.base_url, s.source("api_key")) == ("scripted", None, "default")
    conversation = [Message(role="user", content="q")]
    assert model.complete(conversation, max_tokens=5).text == "first"
    assert model.complete(conversation, max_tokens=5).text == "second"
    # Out of turns is a failure of the model (a model_error stop), not a configuration error.
    with pytest.raises(ModelError, match="2 turns"):
        model.complete(conversation, max_tokens=5)


def test_scripted_path_in_config_is_relative_to_the_file(resolve: Resolve, tmp_path: Path) -> None:
    (tmp_path / "turns.json").write_text('["only"]')
    model, s = resolve(None, config='[model]\nname = "scripted:turns.json"\n')
    assert s.model == str(tmp_path / "turns.json")
    assert model.complete([Message(role="user", content="q")], max_tokens=5).text == "only"


@pytest.mark.parametrize(
    ("content", "match"),
    [(None, "does not exist"), ("{not json", "not readable JSON"), ('{"a": 1}', "list of strings")],
)
def test_scripted_file_errors(
    resolve: Resolve, tmp_path: Path, content: str | None, match: str
) -> None:
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        resolve(f"scripted:{path}")


def test_nothing_configured_says_how(tmp_path: Path) -> None:
    (tmp_path / "empty.toml").write_text("")
    with pytest.raises(ConfigError) as exc:
        resolve_model(environ={}, config_file=tmp_path / "empty.toml")
    message = str(exc.value)
    for needed in (
        "no model is configured",
        "--model openai:gpt-4o-mini",
        "--base-url",
        "SANDCELL_MODEL=",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        str(tmp_path / "empty.toml"),
        "[model]",
        'name = "openai-compatible:',
        "api_key_env",
        "scripted:",
    ):
        assert needed in message, f"{needed!r} missing from:\n{message}"


def test_default_config_file_comes_from_sandcell_config(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('[model]\nname = "openai:from-default-file"\n')
    _, s = resolve_model_and_settings(environ={"SANDCELL_CONFIG": str(path), "OPENAI_API_KEY": "k"})
    assert s.name == "openai:from-default-file"
    assert s.config_file == path
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model(environ={"SANDCELL_CONFIG": str(tmp_path / "missing.toml")})


@pytest.mark.parametrize(
    ("spec", "env", "match"),
    [
        ("gpt-4o", {}, "not PROVIDER:MODEL"),
        ("openai:", {}, "not PROVIDER:MODEL"),
        ("gemini:pro", {}, "unknown model provider 'gemini'"),
        ("openai:gpt-4o", {}, "set OPENAI_API_KEY"),
        ("anthropic:claude", {}, "set ANTHROPIC_API_KEY"),
        ("openai-compatible:llama", {}, "--base-url"),
        ("openai:gpt-4o", {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "localhost:8000"}, "http"),
    ],
)
def test_invalid_specs_and_missing_pieces(
    resolve: Resolve,
    spec: str,
    env: dict[str, str],
    match: str,
) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve(spec, env=env)


def test_missing_key_names_the_configured_variable(resolve: Resolve) -> None:
    with pytest.raises(ConfigError, match=r"set FILE_KEY .*api_key_env"):
        resolve(None, config=FILE)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ('[model]\nname = "openai:x"\napi_key = "sk-1"\n', "keys are never stored"),
        ('[model]\nname = "openai:x"\ncolour = "blue"\n', "unknown key"),
        ('[model]\nname = "nope"\n', "not PROVIDER:MODEL"),
        ("[model\n", "not valid TOML"),
        ('model = "openai:x"\n', "must be a table"),
        ('[model]\nname = "openai:x"\ntimeout_s = "slow"\n', "timeout_s"),
        ('[model]\nname = "openai:x"\ntimeout_s = 0\n', "positive"),
        ('[model]\nname = "openai:x"\nmax_tokens = -1\n', "max_tokens"),
        ('[model]\nname = ""\n', "non-empty string"),
    ],
)
def test_bad_config_files(resolve: Resolve, config: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve(None, env={"OPENAI_API_KEY": "k"}, config=config)


def test_other_sections_of_the_config_file_are_left_alone(resolve: Resolve) -> None:
    config = '[server]\nport = 1\n\n[model]\nname = "openai:x"\n'
    _, s = resolve(None, env={"OPENAI_API_KEY": "k"}, config=config)
    assert s.name == "openai:x"


@pytest.mark.parametrize(
    ("spec", "sdk"), [("openai:gpt-4o", "openai"), ("anthropic:c", "anthropic")]
)
def test_missing_sdk_names_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec: str, sdk: str
) -> None:
    # None in sys.modules makes `import openai` fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, sdk, None)
    adapter = {"openai": "openai_chat", "anthropic": "anthropic_messages"}[sdk]
    monkeypatch.delitem(sys.modules, f"sandcell.models.{adapter}", raising=False)
    monkeypatch.delattr(f"sandcell.models.{adapter}", raising=False)
    env = {"OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=rf"pip install 'sandcell\[{sdk}\]'"):
        resolve_model(spec, environ=env, config_file=empty)
    # A scripted model needs no SDK at all.
    script = tmp_path / "t.json"
    script.write_text('["x"]')
    assert isinstance(
        resolve_model(f"scripted:{script}", environ={}, config_file=empty), ScriptedModel
    )


def test_api_key_never_in_settings(resolve: Resolve) -> None:
    for kwargs in (
        {"api_key": SECRET},
        {"env": {"OPENAI_API_KEY": SECRET}},
        {"env": {"FILE_KEY": SECRET}, "config": FILE},
    ):
        spec = None if "config" in kwargs else "openai:gpt-4o"
        _, s = resolve(spec, **kwargs)
        shown = (repr(s), str(s), s.describe(), json.dumps(s.to_dict()))
        assert not [text for text in shown if SECRET in text]
        assert s.source("api_key") != "default"


def test_settings_describe_and_to_dict(resolve: Resolve) -> None:
    _, s = resolve("openai:gpt-4o", env={"OPENAI_API_KEY": "k"})
    assert s.describe() == (
        "openai:gpt-4o at https://api.openai.com/v1 (model from argument; key from env "
        "OPENAI_API_KEY)"
    )
    d = s.to_dict()
    assert d["sources"] == {
        "name": "argument",
        "base_url": "default",
        "api_key": "env OPENAI_API_KEY",
    }
    assert json.loads(json.dumps(d)) == d


def test_parse_spec_keeps_colons_in_the_model_id() -> None:
    assert parse_spec(" openai-compatible:qwen2.5:7b ") == ("openai-compatible", "qwen2.5:7b")
