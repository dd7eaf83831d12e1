"""A Model over the Anthropic Messages API, through the official ``anthropic`` SDK.

The Messages API differs from chat completions in two ways this adapter absorbs: the system
prompt is the ``system`` parameter, not a message, and the conversation must alternate user and
assistant turns starting with the user, so consecutive messages of one role are merged into one.

Retries: the SDK's own retries are switched off (``max_retries=0``). A 429 (``rate_limit_error``)
or 529 (``overloaded_error``) comes back at once as :class:`~sandcell.errors.ModelRateLimited`
with the ``retry-after`` hint, server and network failures as a retryable
:class:`~sandcell.errors.ModelError`, and the agent loop decides whether and when to retry.

Security limitations: the API key is held in memory by the SDK client and sent to ``base_url``;
the prompt, which includes program output, leaves the host for that server.
"""

from __future__ import annotations

from collections.abc import Sequence

import anthropic
from anthropic.types import MessageParam

from sandcell.errors import ConfigError
from sandcell.models import _errors
from sandcell.models.base import Completion, Message, TokenUsage

ANTHROPIC_URL = "https://api.anthropic.com"
DEFAULT_TIMEOUT_S = 300.0


class AnthropicMessagesModel:
    """``complete()`` is one ``POST {base_url}/v1/messages`` with the SDK's retries off."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str = ANTHROPIC_URL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        api_key_env: str | None = "ANTHROPIC_API_KEY",
    ) -> None:
        self.name = f"anthropic:{model}"
        self.model = model
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._api_key_env = api_key_env
        # An explicit key and base URL keep the SDK from consulting ANTHROPIC_* variables and
        # credential profiles on disk behind the configuration that resolved this model.
        self._client = anthropic.Anthropic(
            api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0
        )

    def complete(
        self, messages: Sequence[Message], *, max_tokens: int, temperature: float | None = None
    ) -> Completion:
        """Ask for one completion of ``messages``; raises ModelError or ModelRateLimited."""
        system, turns = to_wire(messages)
        try:
            response = self._client.messages.create(
                model=self.model,
                max_tokens=max_tokens,
                messages=turns,
                system=system if system else anthropic.omit,
                # The SDK dropped the typed parameter (newer models fix their sampling); the
                # API still takes it for the models that do, so it goes in the body when asked.
                extra_body={"temperature": temperature} if temperature is not None else None,
            )
        except anthropic.APIStatusError as exc:
            raise _errors.status_error(
                provider="anthropic",
                status=exc.status_code,
                headers=exc.response.headers,
                body=exc.body,
                url=self.base_url,
                api_key_env=self._api_key_env,
            ) from exc
        except anthropic.APITimeoutError as exc:
            raise _errors.timeout_error(
                provider="anthropic", url=self.base_url, timeout_s=self.timeout_s
            ) from exc
        except anthropic.APIConnectionError as exc:
            raise _errors.connection_error(
                provider="anthropic", url=self.base_url, cause=exc.__cause__
            ) from exc
        except (anthropic.APIResponseValidationError, ValueError) as exc:
            # ValueError covers a body that is not JSON at all (json.JSONDecodeError).
            raise _errors.bad_response(
                provider="anthropic", url=self.base_url, what=f"{type(exc).__name__}: {exc}"
            ) from exc
        except anthropic.AnthropicError as exc:
            raise _errors.sdk_error(provider="anthropic", url=self.base_url, exc=exc) from exc
        return self._completion(response)

    def _completion(self, response: object) -> Completion:
        content = getattr(response, "content", None)
        if not isinstance(content, list):
            raise _errors.bad_response(
                provider="anthropic", url=self.base_url, what="no content blocks in the answer"
            )
        # Only text blocks carry the answer; thinking and tool blocks are not part of it.
        text = "".join(
            block.text
            for block in content
            if getattr(block, "type", None) == "text" and isinstance(block.text, str)
        )
        usage = getattr(response, "usage", None)
        model = getattr(response, "model", None)
        stop = getattr(response, "stop_reason", None)
        return Completion(
            text=text,
            usage=TokenUsage(
                input_tokens=_count(getattr(usage, "input_tokens", 0)),
                output_tokens=_count(getattr(usage, "output_tokens", 0)),
            ),
            model=model if isinstance(model, str) and model else self.model,
            finish_reason=stop if isinstance(stop, str) else None,
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> AnthropicMessagesModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def to_wire(messages: Sequence[Message]) -> tuple[str, list[MessageParam]]:
    """The ``system`` text and the alternating turns the Messages API accepts.

    System messages, wherever they stand, are joined into the system prompt in order; runs of
    user or assistant messages are merged into one turn, their contents separated by a blank line.
    """
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    merged: list[tuple[str, list[str]]] = []
    for m in messages:
        if m.role == "system":
            continue
        if merged and merged[-1][0] == m.role:
            merged[-1][1].append(m.content)
        else:
            merged.append((m.role, [m.content]))
    if not merged or merged[0][0] != "user":
        raise ConfigError(
            "the Anthropic Messages API needs a conversation that starts with a user message; "
            f"this one starts with {merged[0][0] if merged else 'nothing but system messages'}"
        )
    turns: list[MessageParam] = []
    for role, parts in merged:
        text = "\n\n".join(parts)
        turns.append(
            {"role": "user", "content": text}
            if role == "user"
            else {"role": "assistant", "content": text}
        )
    return system, turns


def _count(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


__all__ = ["ANTHROPIC_URL", "DEFAULT_TIMEOUT_S", "AnthropicMessagesModel", "to_wire"]
