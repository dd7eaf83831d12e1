"""A Model over the Anthropic Messages API, through the official ``anthropic`` SDK.

The Messages API differs from chat completions in two ways this adapter absorbs: the system
prompt is the ``system`` parameter, not a message, and the conversation must alternate user and
assistant turns starting with the user, so consecutive messages of one role are merged into one.

Tool use: called with ``tools``, the request offers them (``input_schema``) and the completion
returns the ``tool_use`` blocks as tool calls. A tool's result (a ``tool`` message) becomes a
``tool_result`` block at the head of the next user turn, as the API requires. A server that
refuses tools (an HTTP 400 naming them) makes an ``auto`` adapter switch itself to ``text`` and
raise :class:`~sandcell.models.base.ToolsUnsupported`.

Retries: the SDK's own retries are switched off (``max_retries=0``). A 429 (``rate_limit_error``)
or 529 (``overloaded_error``) comes back at once as :class:`~sandcell.errors.ModelRateLimited`
with the ``retry-after`` hint, server and network failures as a retryable
:class:`~sandcell.errors.ModelError`, and the agent loop decides whether and when to retry.

Security limitations: the API key is held in memory by the SDK client and sent to ``base_url``;
the prompt, which includes program output, leaves the host for that server.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import anthropic
from anthropic.types import (
    MessageParam,
    TextBlockParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
)

from sandcell.errors import ConfigError
from sandcell.models import _errors
from sandcell.models.base import (
    Completion,
    Message,
    TokenUsage,
    ToolCall,
    ToolCalling,
    ToolSpec,
    ToolsUnsupported,
)

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
        tool_calling: ToolCalling = "auto",
    ) -> None:
        self.name = f"anthropic:{model}"
        self.model = model
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._api_key_env = api_key_env
        self.tool_calling: ToolCalling = tool_calling
        # An explicit key and base URL keep the SDK from consulting ANTHROPIC_* variables and
        # credential profiles on disk behind the configuration that resolved this model.
        self._client = anthropic.Anthropic(
            api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0
        )

    def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        """Ask for one completion of ``messages``; raises ModelError or ModelRateLimited.

        ``tools`` are offered unless ``tool_calling`` is ``text`` (see the module docstring).
        """
        system, turns = to_wire(messages)
        offered: list[ToolParam] = (
            [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": dict(t.parameters),
                }
                for t in tools
            ]
            if self.tool_calling != "text"
            else []
        )
        try:
            response = self._client.messages.create(
                model=self.model,
                max_tokens=max_tokens,
                messages=turns,
                system=system if system else anthropic.omit,
                tools=offered if offered else anthropic.omit,
                # The SDK dropped the typed parameter (newer models fix their sampling); the
                # API still takes it for the models that do, so it goes in the body when asked.
                extra_body={"temperature": temperature} if temperature is not None else None,
            )
        except anthropic.APIStatusError as exc:
            if offered and _errors.rejects_tools(exc.status_code, exc.body):
                refused = _errors.tools_refused(
                    provider="anthropic", url=self.base_url, status=exc.status_code, body=exc.body
                )
                if self.tool_calling == "auto":
                    self.tool_calling = "text"
                    raise ToolsUnsupported(str(refused), status=exc.status_code) from exc
                raise refused from exc
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
        # Text blocks carry the reply and tool_use blocks the calls; thinking is not part of it.
        text = "".join(
            block.text
            for block in content
            if getattr(block, "type", None) == "text" and isinstance(block.text, str)
        )
        calls = tuple(
            ToolCall(
                id=str(getattr(block, "id", "") or f"toolu_{i + 1}"),
                name=str(getattr(block, "name", "")),
                arguments=json.dumps(getattr(block, "input", {})),
            )
            for i, block in enumerate(content)
            if getattr(block, "type", None) == "tool_use"
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
            tool_calls=calls,
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
    user (and tool) or assistant messages are merged into one turn, their texts separated by a
    blank line. A turn with tool calls or tool results is a list of blocks: an assistant's text
    then its ``tool_use`` blocks; a user turn's ``tool_result`` blocks first, then its text.
    """
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    merged: list[tuple[str, list[Message]]] = []
    for m in messages:
        if m.role == "system":
            continue
        side = "assistant" if m.role == "assistant" else "user"
        if merged and merged[-1][0] == side:
            merged[-1][1].append(m)
        else:
            merged.append((side, [m]))
    if not merged or merged[0][0] != "user":
        raise ConfigError(
            "the Anthropic Messages API needs a conversation that starts with a user message; "
            f"this one starts with {merged[0][0] if merged else 'nothing but system messages'}"
        )
    return system, [
        _user_turn(group) if side == "user" else _assistant_turn(group) for side, group in merged
    ]


def _user_turn(group: Sequence[Message]) -> MessageParam:
    text = "\n\n".join(m.content for m in group if m.role == "user")
    results: list[ToolResultBlockParam] = [
        {"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": m.content}
        for m in group
        if m.role == "tool"
    ]
    if not results:
        return {"role": "user", "content": text}
    blocks: list[ToolResultBlockParam | TextBlockParam] = [*results]
    if text:
        blocks.append({"type": "text", "text": text})
    return {"role": "user", "content": blocks}


def _assistant_turn(group: Sequence[Message]) -> MessageParam:
    text = "\n\n".join(m.content for m in group if m.content)
    uses: list[ToolUseBlockParam] = [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _arguments(c.arguments)}
        for m in group
        for c in m.tool_calls
    ]
    if not uses:
        return {"role": "assistant", "content": text}
    blocks: list[TextBlockParam | ToolUseBlockParam] = (
        [{"type": "text", "text": text}] if text else []
    )
    blocks += uses
    return {"role": "assistant", "content": blocks}


def _arguments(text: str) -> dict[str, object]:
    # The API wants the call's input as an object; arguments it sent are one, and text a model
    # broke is sent back as a string under "input" rather than dropped.
    try:
        value = json.loads(text)
    except ValueError:
        return {"input": text}
    return value if isinstance(value, dict) else {"input": value}


def _count(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


__all__ = ["ANTHROPIC_URL", "DEFAULT_TIMEOUT_S", "AnthropicMessagesModel", "to_wire"]
