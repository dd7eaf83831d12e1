"""A Model over the OpenAI Chat Completions API, through the official ``openai`` SDK.

One adapter serves OpenAI itself and every server that speaks the same wire format (vLLM,
Ollama, llama.cpp's server, LiteLLM...) through ``base_url``.

Tool calling: called with ``tools``, the request carries them as ``function`` tools and the
completion returns the model's ``tool_calls``. A server without tool calling answers such a
request with an HTTP 400 (or 422) whose message names tools; with ``tool_calling="auto"`` the
adapter then switches itself to ``text`` and raises
:class:`~sandcell.models.base.ToolsUnsupported`, so the caller repeats the turn as plain text.

Retries: the SDK's own retries are switched off (``max_retries=0``). A failure comes back at once
as :class:`~sandcell.errors.ModelError` (``retryable`` says whether trying again can help) or
:class:`~sandcell.errors.ModelRateLimited` (with the provider's ``retry-after`` hint), and the
agent loop, which owns the run's time and token budget, decides whether and when to retry.

Security limitations: the API key is held in memory by the SDK client and sent to ``base_url``
(over plain HTTP if the URL says ``http://``); the prompt, which includes program output, leaves
the host for that server. Only point ``base_url`` at a server trusted with both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

import openai
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

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

OPENAI_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT_S = 300.0

OutputLimitParam = Literal["max_tokens", "max_completion_tokens"]
"""How the request names its output limit: OpenAI's current models take
``max_completion_tokens`` (and reject ``max_tokens``); compatible servers take ``max_tokens``."""


class OpenAIChatModel:
    """``complete()`` is one ``POST {base_url}/chat/completions`` with the SDK's retries off."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str = OPENAI_URL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        provider: str = "openai",
        api_key_env: str | None = "OPENAI_API_KEY",
        limit_param: OutputLimitParam = "max_tokens",
        tool_calling: ToolCalling = "auto",
    ) -> None:
        self.name = f"{provider}:{model}"
        self.model = model
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._provider = provider
        self._api_key_env = api_key_env
        self.limit_param = limit_param
        self.tool_calling: ToolCalling = tool_calling
        # The base URL is always explicit: left out, the SDK would read OPENAI_BASE_URL itself,
        # behind the back of the configuration that resolved this model.
        self._client = openai.OpenAI(
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

        ``tools`` are offered unless ``tool_calling`` is ``text``; a server that rejects them
        raises :class:`ToolsUnsupported` under ``auto`` (see the module docstring).
        """
        wire: list[ChatCompletionMessageParam] = [_wire_message(m) for m in messages]
        by_name = self.limit_param == "max_tokens"
        offered = [_wire_tool(t) for t in tools] if self.tool_calling != "text" else []
        try:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=wire,
                max_tokens=max_tokens if by_name else openai.omit,
                max_completion_tokens=openai.omit if by_name else max_tokens,
                temperature=temperature if temperature is not None else openai.omit,
                tools=offered if offered else openai.omit,
            )
        except openai.APIStatusError as exc:
            if offered and _errors.rejects_tools(exc.status_code, exc.body):
                refused = _errors.tools_refused(
                    provider=self._provider,
                    url=self.base_url,
                    status=exc.status_code,
                    body=exc.body,
                )
                if self.tool_calling == "auto":
                    self.tool_calling = "text"
                    raise ToolsUnsupported(str(refused), status=exc.status_code) from exc
                raise refused from exc
            raise _errors.status_error(
                provider=self._provider,
                status=exc.status_code,
                headers=exc.response.headers,
                body=exc.body,
                url=self.base_url,
                api_key_env=self._api_key_env,
            ) from exc
        except openai.APITimeoutError as exc:
            raise _errors.timeout_error(
                provider=self._provider, url=self.base_url, timeout_s=self.timeout_s
            ) from exc
        except openai.APIConnectionError as exc:
            raise _errors.connection_error(
                provider=self._provider, url=self.base_url, cause=exc.__cause__
            ) from exc
        except (openai.APIResponseValidationError, ValueError) as exc:
            # ValueError covers a body that is not JSON at all (json.JSONDecodeError).
            raise _errors.bad_response(
                provider=self._provider, url=self.base_url, what=f"{type(exc).__name__}: {exc}"
            ) from exc
        except openai.OpenAIError as exc:
            raise _errors.sdk_error(provider=self._provider, url=self.base_url, exc=exc) from exc
        return self._completion(response)

    def _completion(self, response: object) -> Completion:
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise _errors.bad_response(
                provider=self._provider, url=self.base_url, what="no choices in the answer"
            )
        choice = choices[0]
        message = getattr(choice, "message", None)
        calls = self._tool_calls(getattr(message, "tool_calls", None))
        text = getattr(message, "content", None)
        if text is None:
            refusal = getattr(message, "refusal", None)
            text = f"(the model refused: {refusal})" if refusal else ""
        if not isinstance(text, str):
            raise _errors.bad_response(
                provider=self._provider, url=self.base_url, what="message content is not text"
            )
        usage = getattr(response, "usage", None)
        model = getattr(response, "model", None)
        finish = getattr(choice, "finish_reason", None)
        return Completion(
            text=text,
            # Some compatible servers send no usage; zero is "unknown", not "free".
            usage=TokenUsage(
                input_tokens=_count(getattr(usage, "prompt_tokens", 0)),
                output_tokens=_count(getattr(usage, "completion_tokens", 0)),
            ),
            model=model if isinstance(model, str) and model else self.model,
            finish_reason=finish if isinstance(finish, str) else None,
            tool_calls=calls,
        )

    def _tool_calls(self, raw: object) -> tuple[ToolCall, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list):
            raise _errors.bad_response(
                provider=self._provider, url=self.base_url, what="tool_calls is not a list"
            )
        calls = []
        for i, item in enumerate(raw):
            function = getattr(item, "function", None)
            name = getattr(function, "name", None)
            arguments = getattr(function, "arguments", None)
            if not isinstance(name, str) or not isinstance(arguments, str):
                raise _errors.bad_response(
                    provider=self._provider,
                    url=self.base_url,
                    what=f"tool call {i + 1} has no function name and arguments",
                )
            call_id = getattr(item, "id", None)
            # Some compatible servers leave the id out; the result must still name a call.
            calls.append(
                ToolCall(
                    id=call_id if isinstance(call_id, str) and call_id else f"call_{i + 1}",
                    name=name,
                    arguments=arguments,
                )
            )
        return tuple(calls)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> OpenAIChatModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wire_message(message: Message) -> ChatCompletionMessageParam:
    if message.role == "system":
        return {"role": "system", "content": message.content}
    if message.role == "user":
        return {"role": "user", "content": message.content}
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content,
        }
    if message.tool_calls:
        return {
            "role": "assistant",
            # Servers differ on an empty string next to tool calls; null is the documented form.
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in message.tool_calls
            ],
        }
    return {"role": "assistant", "content": message.content}


def _wire_tool(tool: ToolSpec) -> ChatCompletionToolParam:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": json.loads(json.dumps(dict(tool.parameters))),
        },
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


__all__ = ["DEFAULT_TIMEOUT_S", "OPENAI_URL", "OpenAIChatModel", "OutputLimitParam"]
