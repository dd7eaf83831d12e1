"""Language models for the agent: one small interface, fakes, and provider adapters."""

# Model configuration (resolve_model and friends). The provider adapters (openai_chat,
# anthropic_messages) are not re-exported: importing them needs the optional SDKs, so
# resolve_model imports them only when a provider asks for one.
from sandcell.models.config import (
    ModelSettings,
    Provider,
    default_config_path,
    parse_spec,
    resolve_model,
    resolve_model_and_settings,
)

__all__ = [
    "ModelSettings",
    "Provider",
    "default_config_path",
    "parse_spec",
    "resolve_model",
    "resolve_model_and_settings",
]
