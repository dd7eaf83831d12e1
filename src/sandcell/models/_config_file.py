"""The ``[model]`` section of sandcell's config file, read and checked (keys, types, no secrets).

The file is TOML; other sections belong to other parts of sandcell and are left alone. A key is
never accepted in the file: ``api_key_env`` names the environment variable that holds it.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from sandcell.errors import ConfigError

_FILE_KEYS = frozenset(
    {"name", "base_url", "api_key_env", "timeout_s", "max_tokens", "tool_calling"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FileConfig:
    """The ``[model]`` section as read; ``None`` for a key the file does not set."""

    path: Path
    name: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float | None = None
    max_tokens: int | None = None
    tool_calling: str | None = None
    """``auto``, ``native`` or ``text`` (checked where the model is resolved)."""


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$SANDCELL_CONFIG``, else ``config.toml`` in the user config directory."""
    env = os.environ if environ is None else environ
    explicit = env.get("SANDCELL_CONFIG")
    if explicit:
        return Path(explicit)
    return Path(platformdirs.user_config_dir("sandcell")) / "config.toml"


def read_config(config_file: Path | None, environ: Mapping[str, str]) -> FileConfig | None:
    """The file's model settings; ``None`` when the default file does not exist."""
    path = config_file if config_file is not None else default_config_path(environ)
    # A file named on purpose (argument or SANDCELL_CONFIG) must exist; the default may not.
    named = config_file is not None or bool(environ.get("SANDCELL_CONFIG"))
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if named:
            raise ConfigError(
                f"config file {path} does not exist; create it or point SANDCELL_CONFIG elsewhere"
            ) from None
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    section = data.get("model")
    if section is None:
        return FileConfig(path=path)
    if not isinstance(section, dict):
        raise ConfigError(f"[model] in {path} must be a table")
    return _parse_section(path, section)


def _parse_section(path: Path, section: dict[str, object]) -> FileConfig:
    if "api_key" in section:
        raise ConfigError(
            f"{path} has api_key in [model]: keys are never stored in the config file. Put the "
            'key in an environment variable and name it: api_key_env = "OPENAI_API_KEY"'
        )
    unknown = sorted(set(section) - _FILE_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(unknown)} in [model] of {path}; "
            f"allowed: {', '.join(sorted(_FILE_KEYS))}"
        )
    name = _str(path, section, "name")
    timeout = section.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise ConfigError(f"timeout_s in [model] of {path} must be a number of seconds")
    max_tokens = section.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0
    ):
        raise ConfigError(f"max_tokens in [model] of {path} must be a positive integer")
    return FileConfig(
        path=path,
        name=name,
        base_url=_str(path, section, "base_url"),
        api_key_env=_str(path, section, "api_key_env"),
        timeout_s=float(timeout) if timeout is not None else None,
        max_tokens=max_tokens,
        tool_calling=_str(path, section, "tool_calling"),
    )


def _str(path: Path, section: Mapping[str, object], key: str) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key} in [model] of {path} must be a non-empty string")
    return value.strip()


__all__ = ["FileConfig", "default_config_path", "read_config"]
