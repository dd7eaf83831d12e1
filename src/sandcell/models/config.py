"""Which model ``sandcell ask`` talks to: flags, environment and config file, resolved in one place.

A model is named ``provider:model``::

    openai:gpt-4o-mini                      OpenAI (key: OPENAI_API_KEY)
    anthropic:claude-sonnet-4-5             Anthropic (key: ANTHROPIC_API_KEY)
    openai-compatible:llama3.1              vLLM, Ollama, llama.cpp... (needs a base URL)
    scripted:turns.json                     replays a JSON list of replies; no provider, no key

Each value is taken from the first source that has it: explicit arguments (the CLI's flags), then
the environment (``SANDCELL_MODEL``, ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``), then the ``[model]`` section of the config file
(``$SANDCELL_CONFIG``, else ``config.toml`` in the user config directory)::

    [model]
    name = "openai-compatible:llama3.1"
    base_url = "http://localhost:11434/v1"
    api_key_env = "OLLAMA_KEY"    # the variable that holds the key, never the key itself
    timeout_s = 300
    max_tokens = 4096
    tool_calling = "auto"         # "native" or "text"; see sandcell.models.base.ToolCalling

The file's ``base_url`` and ``api_key_env`` apply only to the provider its ``name`` names, so a
``--model`` for another provider does not inherit a URL meant for a different server.

Security limitations: API keys are read from the environment (or an explicit argument) and handed
to the provider SDK; they are never read from or written to the config file, and
:class:`ModelSettings`, which the CLI prints and the run record keeps, holds only the *name* of
the variable a key came from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Literal

from sandcell.errors import ConfigError
from sandcell.models._config_file import FileConfig, default_config_path, read_config
from sandcell.models.base import TOOL_CALLING_MODES, Model, ToolCalling
from sandcell.models.fake import ScriptedModel, turns_from_json

Provider = Literal["openai", "anthropic", "openai-compatible", "scripted"]
PROVIDERS: tuple[Provider, ...] = ("openai", "anthropic", "openai-compatible", "scripted")

DEFAULT_TIMEOUT_S = 300.0
# The official endpoints, spelled out so the SDKs never fall back to their own env lookups.
_DEFAULT_URL: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}
_KEY_ENV: dict[str, str] = {
    "openai": "OPENAI_API_KEY",
    "openai-compatible": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}
_URL_ENV: dict[str, str] = {
    "openai": "OPENAI_BASE_URL",
    "openai-compatible": "OPENAI_BASE_URL",
    "anthropic": "ANTHROPIC_BASE_URL",
}
# Local OpenAI-compatible servers usually want no key, but the SDK insists on one.
_NO_KEY = "sandcell-no-key"
ARGUMENT = "argument"
DEFAULT = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSettings:
    """What was resolved and where each value came from; never the API key itself."""

    name: str
    """``provider:model``, as the record and the CLI name the model."""
    provider: Provider
    model: str
    """The provider's model id, or the script path for ``scripted``."""
    base_url: str | None
    """The endpoint requests go to; ``None`` for a scripted model."""
    api_key_env: str | None
    """The environment variable the key was read from; ``None`` if passed as an argument or
    not used."""
    timeout_s: float
    max_tokens: int | None
    """The config file's output budget per completion, for the agent; ``None`` leaves it to the
    agent's default."""
    config_file: Path | None
    """The config file that was read, if any."""
    tool_calling: ToolCalling = "auto"
    """Native tool calling (``native``), plain text (``text``), or tools with a fallback to
    text when the server rejects them (``auto``); a scripted model follows its script."""
    sources: tuple[tuple[str, str], ...]
    """``(field, source)`` pairs: ``argument``, ``env NAME``, ``config PATH`` or ``default``."""

    def source(self, field: str) -> str:
        """Where ``field`` (``name``, ``base_url``, ``api_key``, ``timeout_s``...) came from."""
        return dict(self.sources).get(field, DEFAULT)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready description for the run record and ``--json`` output."""
        return {
            "name": self.name,
            "provider": self.provider,
            "model": self.model,
            "base_url": self.base_url,
            "api_key_env": self.api_key_env,
            "timeout_s": self.timeout_s,
            "max_tokens": self.max_tokens,
            "config_file": str(self.config_file) if self.config_file else None,
            "tool_calling": self.tool_calling,
            "sources": dict(self.sources),
        }

    def describe(self) -> str:
        """One line for people: the model, the endpoint and where they were configured."""
        where = f" at {self.base_url}" if self.base_url else ""
        key = self.source("api_key")
        return f"{self.name}{where} (model from {self.source('name')}; key from {key})"


def resolve_model_and_settings(
    spec: str | None = None,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    tool_calling: ToolCalling | None = None,
) -> tuple[Model, ModelSettings]:
    """The configured model, ready to call, and a key-free description of how it was chosen.

    Raises :class:`ConfigError` when no model is configured (the message says how), when a value
    is invalid, when a provider's key is missing, or when the provider's SDK is not installed.
    """
    settings, key = _resolve(
        spec,
        base_url=base_url,
        api_key=api_key,
        config_file=config_file,
        environ=os.environ if environ is None else environ,
        timeout_s=timeout_s,
        tool_calling=tool_calling,
    )
    return _build(settings, key), settings


def resolve_model(
    spec: str | None = None,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    tool_calling: ToolCalling | None = None,
) -> Model:
    """The configured model; see :func:`resolve_model_and_settings`."""
    model, _ = resolve_model_and_settings(
        spec,
        base_url=base_url,
        api_key=api_key,
        config_file=config_file,
        environ=environ,
        timeout_s=timeout_s,
        tool_calling=tool_calling,
    )
    return model


def parse_spec(spec: str) -> tuple[Provider, str]:
    """``provider:model`` split at the first colon (model ids such as ``llama3:8b`` keep theirs)."""
    provider, sep, model = spec.strip().partition(":")
    if not sep or not model.strip():
        raise ConfigError(
            f"model {spec!r} is not PROVIDER:MODEL; write e.g. openai:gpt-4o-mini, "
            "anthropic:claude-sonnet-4-5, openai-compatible:llama3.1 or scripted:turns.json"
        )
    if provider not in PROVIDERS:
        raise ConfigError(
            f"unknown model provider {provider!r} in {spec!r}; use one of {', '.join(PROVIDERS)}"
        )
    return provider, model.strip()


def _resolve(
    spec: str | None,
    *,
    base_url: str | None,
    api_key: str | None,
    config_file: Path | None,
    environ: Mapping[str, str],
    timeout_s: float | None,
    tool_calling: ToolCalling | None = None,
) -> tuple[ModelSettings, str | None]:
    file = read_config(config_file, environ)
    if file and file.name:
        try:
            parse_spec(file.name)
        except ConfigError as exc:
            raise ConfigError(f"name in [model] of {file.path}: {exc}") from None
    sources: dict[str, str] = {}
    file_src = f"config {file.path}" if file else ""

    name: str | None
    if spec:
        name, sources["name"] = spec, ARGUMENT
    elif environ.get("SANDCELL_MODEL"):
        name, sources["name"] = environ["SANDCELL_MODEL"], "env SANDCELL_MODEL"
    elif file and file.name:
        name, sources["name"] = file.name, file_src
    else:
        raise ConfigError(_nothing_configured(config_file, environ))
    provider, model_id = parse_spec(name)

    # The file's endpoint and key variable belong to the provider the file names.
    applies = file is not None and (file.name is None or parse_spec(file.name)[0] == provider)
    file_url = file.base_url if file and applies else None
    file_key_env = file.api_key_env if file and applies else None

    timeout = _timeout(timeout_s, file, sources, file_src)
    max_tokens = file.max_tokens if file else None
    if max_tokens is not None:
        sources["max_tokens"] = file_src
    calling = _tool_calling(tool_calling, file, sources, file_src)

    if provider == "scripted":
        script = Path(model_id).expanduser()
        if file and sources["name"] == file_src and not script.is_absolute():
            script = file.path.parent / script
        settings = ModelSettings(
            name=f"scripted:{model_id}",
            provider=provider,
            model=str(script),
            base_url=None,
            api_key_env=None,
            timeout_s=timeout,
            max_tokens=max_tokens,
            config_file=file.path if file else None,
            tool_calling=calling,
            sources=tuple(sources.items()),
        )
        return settings, None

    url = _base_url(
        provider,
        explicit=base_url,
        environ=environ,
        file_url=file_url,
        sources=sources,
        file_src=file_src,
    )
    key_env = file_key_env or _KEY_ENV[provider]
    key: str | None
    used_env: str | None = None
    if api_key:
        key, sources["api_key"] = api_key, ARGUMENT
    elif environ.get(key_env):
        key, used_env, sources["api_key"] = environ[key_env], key_env, f"env {key_env}"
    elif provider == "openai-compatible":
        key, sources["api_key"] = None, "none (not sent)"
    else:
        raise ConfigError(
            f"no API key for {name}: set {key_env} in the environment"
            + (
                f" (named by api_key_env in {file.path})"
                if file_key_env and file
                else " (or name another variable with api_key_env in the config file's [model])"
            )
        )
    settings = ModelSettings(
        name=f"{provider}:{model_id}",
        provider=provider,
        model=model_id,
        base_url=url,
        api_key_env=used_env,
        timeout_s=timeout,
        max_tokens=max_tokens,
        config_file=file.path if file else None,
        tool_calling=calling,
        sources=tuple(sources.items()),
    )
    return settings, key


def _timeout(
    timeout_s: float | None, file: FileConfig | None, sources: dict[str, str], file_src: str
) -> float:
    if timeout_s is not None:
        sources["timeout_s"] = ARGUMENT
        value = float(timeout_s)
    elif file and file.timeout_s is not None:
        sources["timeout_s"] = file_src
        value = file.timeout_s
    else:
        return DEFAULT_TIMEOUT_S
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"model timeout_s must be a positive number of seconds, not {value!r}")
    return value


def _tool_calling(
    explicit: ToolCalling | None, file: FileConfig | None, sources: dict[str, str], file_src: str
) -> ToolCalling:
    value: str
    if explicit is not None:
        value, sources["tool_calling"] = explicit, ARGUMENT
    elif file and file.tool_calling is not None:
        value, sources["tool_calling"] = file.tool_calling, file_src
    else:
        return "auto"
    if value not in TOOL_CALLING_MODES:
        raise ConfigError(
            f"tool_calling must be one of {', '.join(TOOL_CALLING_MODES)}, not {value!r}"
        )
    return value


def _base_url(
    provider: Provider,
    *,
    explicit: str | None,
    environ: Mapping[str, str],
    file_url: str | None,
    sources: dict[str, str],
    file_src: str,
) -> str:
    env_name = _URL_ENV[provider]
    if explicit:
        url, sources["base_url"] = explicit, ARGUMENT
    elif environ.get(env_name):
        url, sources["base_url"] = environ[env_name], f"env {env_name}"
    elif file_url:
        url, sources["base_url"] = file_url, file_src
    elif provider in _DEFAULT_URL:
        url, sources["base_url"] = _DEFAULT_URL[provider], DEFAULT
    else:
        raise ConfigError(
            "an openai-compatible model needs the server's base URL: pass --base-url "
            "http://localhost:8000/v1 (vLLM), http://localhost:11434/v1 (Ollama) or "
            f"http://localhost:8080/v1 (llama.cpp), set {env_name}, or write base_url in the "
            "[model] section of the config file"
        )
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"model base URL {url!r} must start with http:// or https://")
    return url.rstrip("/")


def _build(settings: ModelSettings, key: str | None) -> Model:
    if settings.provider == "scripted":
        return _scripted(settings)
    assert settings.base_url is not None  # resolved for every provider but scripted
    if settings.provider == "anthropic":
        try:
            from sandcell.models.anthropic_messages import AnthropicMessagesModel
        except ImportError as exc:
            raise _sdk_missing("anthropic", exc) from exc
        return AnthropicMessagesModel(
            settings.model,
            api_key=key or "",
            base_url=settings.base_url,
            timeout_s=settings.timeout_s,
            api_key_env=settings.api_key_env,
            tool_calling=settings.tool_calling,
        )
    try:
        from sandcell.models.openai_chat import OpenAIChatModel
    except ImportError as exc:
        raise _sdk_missing("openai", exc) from exc
    official = settings.provider == "openai" and settings.base_url == _DEFAULT_URL["openai"]
    return OpenAIChatModel(
        settings.model,
        api_key=key or _NO_KEY,
        base_url=settings.base_url,
        timeout_s=settings.timeout_s,
        provider=settings.provider,
        api_key_env=settings.api_key_env,
        # OpenAI's reasoning models refuse max_tokens; compatible servers may not know the new name.
        limit_param="max_completion_tokens" if official else "max_tokens",
        tool_calling=settings.tool_calling,
    )


def _sdk_missing(sdk: str, exc: ImportError) -> ConfigError:
    return ConfigError(
        f"the {sdk} SDK is not installed (or is broken: {exc}); install it with "
        f"pip install 'sandcell[{sdk}]'"
    )


def _scripted(settings: ModelSettings) -> Model:
    path = Path(settings.model)
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_float=Decimal)
    except FileNotFoundError:
        raise ConfigError(
            f"scripted model file {path} does not exist; write a JSON list of replies there"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"scripted model file {path} is not readable JSON: {exc}") from exc
    turns = turns_from_json(data, where=f"scripted model file {path}")
    model = ScriptedModel(turns, name=settings.name)
    if settings.source("tool_calling") != DEFAULT:
        model.tool_calling = settings.tool_calling
    return model


def _nothing_configured(config_file: Path | None, environ: Mapping[str, str]) -> str:
    path = config_file if config_file is not None else default_config_path(environ)
    return f"""no model is configured. Choose one of:
  a flag:       --model openai:gpt-4o-mini   (or anthropic:claude-sonnet-4-5; with OPENAI_API_KEY or
                ANTHROPIC_API_KEY set), or --model openai-compatible:llama3.1 --base-url
                http://localhost:11434/v1 for a local server (vLLM, Ollama, llama.cpp)
  the environment: SANDCELL_MODEL=openai:gpt-4o-mini (keys in OPENAI_API_KEY / ANTHROPIC_API_KEY,
                endpoints in OPENAI_BASE_URL / ANTHROPIC_BASE_URL)
  a config file: {path} (or the file SANDCELL_CONFIG names) with
                [model]
                name = "openai-compatible:llama3.1"
                base_url = "http://localhost:11434/v1"
                api_key_env = "OPENAI_API_KEY"   # the variable holding the key; never the key
                timeout_s = 300
  offline:      --model scripted:turns.json replays a JSON list of replies (no provider, no key)"""


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "PROVIDERS",
    "ModelSettings",
    "Provider",
    "default_config_path",
    "parse_spec",
    "resolve_model",
    "resolve_model_and_settings",
]
