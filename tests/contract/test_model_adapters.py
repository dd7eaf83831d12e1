"""The provider adapters against real local HTTP servers that speak each provider's wire format.

The official SDKs run their whole code path (request building, HTTP, response parsing); only the
server is ours. Each test checks what the server received and what the adapter made of the answer,
including the failures the agent must tell apart: bad key, rate limit with a retry hint, overload,
server error, garbage, no server at all, no answer in time.
"""

from __future__ import annotations

import email.utils
import errno
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sandcell.agent.tools import TOOLS
from sandcell.errors import ConfigError, ModelError, ModelRateLimited
from sandcell.models import resolve_model, resolve_model_and_settings
from sandcell.models._errors import parse_retry_after
from sandcell.models.anthropic_messages import AnthropicMessagesModel, to_wire
from sandcell.models.base import Message, ToolCall, ToolsUnsupported
from sandcell.models.openai_chat import OpenAIChatModel


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes | dict[str, object] = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, object]


class ProviderServer:
    """A local HTTP server: records every request and answers with ``reply(request)``."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.reply: Callable[[Received], Reply] = lambda _r: Reply(status=500)
        self._release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                got = Received(
                    method="POST",
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=json.loads(raw) if raw else {},
                )
                server.requests.append(got)
                answer = server.reply(got)
                if answer.delay_s:
                    server._release.wait(answer.delay_s)
                body = answer.body
                data = json.dumps(body).encode() if isinstance(body, dict) else body
                try:
                    self.send_response(answer.status)
                    self.send_header("content-type", "application/json")
                    for k, v in answer.headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout test)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    srv = ProviderServer()
    yield srv
    srv.close()


def _refused_url() -> str:
    """A loopback URL where nothing listens (the port was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


CONVERSATION = [
    Message(role="system", content="You write Python."),
    Message(role="user", content="Sum 1..10"),
    Message(role="assistant", content="```python\nprint(sum(range(11)))\n```"),
    Message(role="user", content="It printed 55."),
]

# --- OpenAI Chat Completions -----------------------------------------------------------------


def _chat_ok(text: str = "The sum is 55.", *, usage: bool = True) -> Reply:
    body: dict[str, object] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-test-2025",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}
    return Reply(body=body)


@pytest.fixture
def chat(server: ProviderServer) -> Iterator[OpenAIChatModel]:
    with OpenAIChatModel(
        "gpt-test", api_key="sk-test-key", base_url=f"{server.url}/v1", timeout_s=10
    ) as model:
        yield model


def test_openai_request_and_completion(server: ProviderServer, chat: OpenAIChatModel) -> None:
    server.reply = lambda _r: _chat_ok()
    done = chat.complete(CONVERSATION, max_tokens=256, temperature=0.2)
    assert (done.text, done.model, done.finish_reason) == (
        "The sum is 55.",
        "gpt-test-2025",
        "stop",
    )
    assert (done.usage.input_tokens, done.usage.output_tokens) == (42, 7)
    [req] = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test-key"
    assert req.body["model"] == "gpt-test"
    assert req.body["max_tokens"] == 256
    assert "max_completion_tokens" not in req.body
    assert req.body["temperature"] == 0.2
    assert req.body["messages"] == [{"role": m.role, "content": m.content} for m in CONVERSATION]
    assert chat.name == "openai:gpt-test"


def test_openai_max_completion_tokens_and_no_temperature(server: ProviderServer) -> None:
    server.reply = lambda _r: _chat_ok(usage=False)
    with OpenAIChatModel(
        "o-test", api_key="k", base_url=server.url, limit_param="max_completion_tokens"
    ) as model:
        done = model.complete([Message(role="user", content="hi")], max_tokens=99)
    body = server.requests[0].body
    assert body["max_completion_tokens"] == 99
    assert "max_tokens" not in body
    assert "temperature" not in body
    # A server that reports no usage gives zeros, not an error.
    assert (done.usage.input_tokens, done.usage.output_tokens) == (0, 0)


@pytest.mark.parametrize("status", [401, 403])
def test_openai_auth_failure_names_the_key_variable(
    server: ProviderServer, chat: OpenAIChatModel, status: int
) -> None:
    server.reply = lambda _r: Reply(
        status=status,
        body={"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}},
    )
    with pytest.raises(ModelError) as exc:
        chat.complete(CONVERSATION, max_tokens=10)
    assert exc.value.status == status
    assert not exc.value.retryable
    assert "OPENAI_API_KEY" in str(exc.value)
    assert "Incorrect API key provided" in str(exc.value)
    assert "sk-test-key" not in str(exc.value)


@pytest.mark.parametrize(
    ("headers", "expected"), [({"retry-after": "7"}, 7.0), ({"retry-after-ms": "1500"}, 1.5)]
)
def test_openai_rate_limit_carries_retry_after(
    server: ProviderServer, chat: OpenAIChatModel, headers: dict[str, str], expected: float
) -> None:
    server.reply = lambda _r: Reply(
        status=429,
        headers=headers,
        body={"error": {"message": "Rate limit reached", "type": "requests"}},
    )
    with pytest.raises(ModelRateLimited) as exc:
        chat.complete(CONVERSATION, max_tokens=10)
    assert exc.value.retry_after_s == expected
    assert exc.value.retryable
    assert exc.value.status == 429
    # The SDK's own retries are off: the agent decides, so the server saw exactly one request.
    assert len(server.requests) == 1


def test_openai_server_error_is_retryable(server: ProviderServer, chat: OpenAIChatModel) -> None:
    server.reply = lambda _r: Reply(status=500, body={"error": {"message": "internal"}})
    with pytest.raises(ModelError) as exc:
        chat.complete(CONVERSATION, max_tokens=10)
    assert (exc.value.status, exc.value.retryable) == (500, True)
    assert not isinstance(exc.value, ModelRateLimited)
    assert len(server.requests) == 1


def test_openai_bad_request_is_not_retryable(server: ProviderServer, chat: OpenAIChatModel) -> None:
    server.reply = lambda _r: Reply(status=400, body={"error": {"message": "bad max_tokens"}})
    with pytest.raises(ModelError) as exc:
        chat.complete(CONVERSATION, max_tokens=10)
    assert (exc.value.status, exc.value.retryable) == (400, False)
    assert "bad max_tokens" in str(exc.value)


@pytest.mark.parametrize("body", [b"{not json", b'{"object": "something else"}'])
def test_openai_malformed_answer(
    server: ProviderServer, chat: OpenAIChatModel, body: bytes
) -> None:
    server.reply = lambda _r: Reply(body=body)
    with pytest.raises(ModelError, match="cannot read") as exc:
        chat.complete(CONVERSATION, max_tokens=10)
    assert not exc.value.retryable


def test_openai_connection_refused_names_the_url() -> None:
    url = _refused_url()
    with (
        OpenAIChatModel("m", api_key="k", base_url=url, timeout_s=5) as model,
        pytest.raises(ModelError) as exc,
    ):
        model.complete(CONVERSATION, max_tokens=10)
    assert exc.value.retryable
    assert exc.value.status is None
    assert url in str(exc.value)


def test_openai_timeout_is_retryable(server: ProviderServer) -> None:
    server.reply = lambda _r: Reply(delay_s=30, body=_chat_ok().body)
    with (
        OpenAIChatModel("m", api_key="k", base_url=server.url, timeout_s=0.3) as model,
        pytest.raises(ModelError, match=r"no answer within 0\.3 s") as exc,
    ):
        model.complete(CONVERSATION, max_tokens=10)
    assert exc.value.retryable


# --- Anthropic Messages ----------------------------------------------------------------------


def _anthropic_key(req: Received) -> str | None:
    """The API key as the SDK sent it: ``x-api-key`` (SDK 0.x) or a bearer token (SDK 2.x)."""
    bearer = req.headers.get("authorization", "")
    return req.headers.get("x-api-key") or bearer.removeprefix("Bearer ") or None


def _anthropic_reply(req: Received) -> Reply:
    # The real API refuses requests without a key and a version; so does this server.
    if _anthropic_key(req) != "sk-ant-test" or not req.headers.get("anthropic-version"):
        return Reply(
            status=401,
            body={
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid x-api-key"},
            },
        )
    return Reply(
        body={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test-20250101",
            "content": [
                {"type": "thinking", "thinking": "hidden", "signature": "sig"},
                {"type": "text", "text": "The sum "},
                {"type": "text", "text": "is 55."},
            ],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 31, "output_tokens": 9},
        }
    )


def _anthropic_error(status: int, kind: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(
        status=status,
        headers=headers or {},
        body={"type": "error", "error": {"type": kind, "message": f"{kind} happened"}},
    )


@pytest.fixture
def claude(server: ProviderServer) -> Iterator[AnthropicMessagesModel]:
    with AnthropicMessagesModel(
        "claude-test", api_key="sk-ant-test", base_url=server.url, timeout_s=10
    ) as model:
        yield model


def test_anthropic_request_and_completion(
    server: ProviderServer, claude: AnthropicMessagesModel
) -> None:
    server.reply = _anthropic_reply
    conversation = [
        Message(role="system", content="You write Python."),
        Message(role="user", content="Here is a CSV."),
        Message(role="user", content="Sum column a."),
        Message(role="assistant", content="```python\nprint(1)\n```"),
        Message(role="system", content="Be brief."),
        Message(role="user", content="It printed 1."),
    ]
    done = claude.complete(conversation, max_tokens=300)
    assert (done.text, done.model, done.finish_reason) == (
        "The sum is 55.",
        "claude-test-20250101",
        "end_turn",
    )
    assert (done.usage.input_tokens, done.usage.output_tokens) == (31, 9)
    [req] = server.requests
    assert req.path == "/v1/messages"
    assert _anthropic_key(req) == "sk-ant-test"
    assert req.headers["anthropic-version"]
    assert req.body["model"] == "claude-test"
    assert req.body["max_tokens"] == 300
    assert req.body["system"] == "You write Python.\n\nBe brief."
    assert req.body["messages"] == [
        {"role": "user", "content": "Here is a CSV.\n\nSum column a."},
        {"role": "assistant", "content": "```python\nprint(1)\n```"},
        {"role": "user", "content": "It printed 1."},
    ]
    assert "temperature" not in req.body
    assert claude.name == "anthropic:claude-test"


def test_anthropic_temperature_and_no_system(
    server: ProviderServer, claude: AnthropicMessagesModel
) -> None:
    server.reply = _anthropic_reply
    claude.complete([Message(role="user", content="hi")], max_tokens=5, temperature=0.0)
    body = server.requests[0].body
    assert body["temperature"] == 0.0
    assert "system" not in body


def test_anthropic_conversation_must_start_with_user() -> None:
    with pytest.raises(ConfigError, match="starts with a user message"):
        to_wire([Message(role="system", content="s"), Message(role="assistant", content="a")])
    with pytest.raises(ConfigError, match="nothing but system"):
        to_wire([Message(role="system", content="s")])


def test_anthropic_auth_failure_names_the_key_variable(server: ProviderServer) -> None:
    server.reply = _anthropic_reply
    with (
        AnthropicMessagesModel("c", api_key="wrong", base_url=server.url) as model,
        pytest.raises(ModelError) as exc,
    ):
        model.complete(CONVERSATION, max_tokens=10)
    assert (exc.value.status, exc.value.retryable) == (401, False)
    assert "ANTHROPIC_API_KEY" in str(exc.value)
    assert "invalid x-api-key" in str(exc.value)


@pytest.mark.parametrize(("status", "kind"), [(429, "rate_limit_error"), (529, "overloaded_error")])
def test_anthropic_rate_limit_and_overload(
    server: ProviderServer, claude: AnthropicMessagesModel, status: int, kind: str
) -> None:
    server.reply = lambda _r: _anthropic_error(status, kind, {"retry-after": "12"})
    with pytest.raises(ModelRateLimited) as exc:
        claude.complete(CONVERSATION, max_tokens=10)
    assert (exc.value.status, exc.value.retryable, exc.value.retry_after_s) == (status, True, 12.0)
    assert f"{kind} happened" in str(exc.value)
    assert len(server.requests) == 1


def test_anthropic_server_error_is_retryable(
    server: ProviderServer, claude: AnthropicMessagesModel
) -> None:
    server.reply = lambda _r: _anthropic_error(500, "api_error")
    with pytest.raises(ModelError) as exc:
        claude.complete(CONVERSATION, max_tokens=10)
    assert (exc.value.status, exc.value.retryable) == (500, True)
    assert len(server.requests) == 1


def test_anthropic_malformed_answer(server: ProviderServer, claude: AnthropicMessagesModel) -> None:
    server.reply = lambda _r: Reply(body=b"<html>proxy error</html>")
    with pytest.raises(ModelError, match="cannot read") as exc:
        claude.complete(CONVERSATION, max_tokens=10)
    assert not exc.value.retryable


def test_anthropic_connection_refused_names_the_url() -> None:
    url = _refused_url()
    with (
        AnthropicMessagesModel("c", api_key="k", base_url=url, timeout_s=5) as model,
        pytest.raises(ModelError) as exc,
    ):
        model.complete(CONVERSATION, max_tokens=10)
    assert exc.value.retryable
    assert url in str(exc.value)


# --- Through the configuration ---------------------------------------------------------------


def test_resolved_openai_compatible_model_talks_to_the_server(
    server: ProviderServer, tmp_path: Path
) -> None:
    server.reply = lambda _r: _chat_ok("from llama")
    model, settings = resolve_model_and_settings(
        "openai-compatible:llama3:8b", base_url=f"{server.url}/v1", environ={}
    )
    try:
        assert model.complete([Message(role="user", content="q")], max_tokens=64).text == (
            "from llama"
        )
    finally:
        model.close()  # type: ignore[attr-defined]
    req = server.requests[0]
    assert req.body["model"] == "llama3:8b"
    assert req.body["max_tokens"] == 64
    assert settings.source("api_key") == "none (not sent)"


def test_resolved_anthropic_model_from_the_environment(server: ProviderServer) -> None:
    server.reply = _anthropic_reply
    env = {
        "SANDCELL_MODEL": "anthropic:claude-test",
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": server.url,
    }
    model = resolve_model(environ=env)
    try:
        done = model.complete([Message(role="user", content="q")], max_tokens=8)
    finally:
        model.close()  # type: ignore[attr-defined]
    assert done.text == "The sum is 55."
    assert _anthropic_key(server.requests[0]) == "sk-ant-test"


# --- The test guard (tests/conftest.py) ------------------------------------------------------


def test_guard_blocks_connections_to_public_addresses() -> None:
    with pytest.raises(PermissionError, match="tests may not connect"):
        socket.create_connection(("1.1.1.1", 443), timeout=2)
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s, pytest.raises(PermissionError):
        s.connect(("2606:4700:4700::1111", 443))
    with socket.socket() as s, pytest.raises(PermissionError):
        s.connect_ex(("8.8.8.8", 53))
    # Loopback reaches the kernel: nothing listens there, so the kernel refuses.
    host, port = _refused_url().removeprefix("http://").split(":")
    with socket.socket() as s:
        assert s.connect_ex((host, int(port))) == errno.ECONNREFUSED


def test_guard_blocks_the_sdk_too() -> None:
    with (
        OpenAIChatModel("gpt-4o-mini", api_key="k", base_url="http://1.1.1.1/v1") as model,
        pytest.raises(ModelError, match="tests may not connect") as exc,
    ):
        model.complete([Message(role="user", content="q")], max_tokens=5)
    assert exc.value.retryable


def test_guard_lets_unix_sockets_through(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as srv, socket.socket(socket.AF_UNIX) as cli:
        srv.bind(path)
        srv.listen(1)
        cli.connect(path)


def test_guard_hides_model_settings() -> None:
    assert not [k for k in os.environ if k.startswith(("OPENAI_", "ANTHROPIC_"))]
    assert "SANDCELL_MODEL" not in os.environ
    with pytest.raises(ConfigError, match="no model is configured"):
        resolve_model()


def test_retry_after_forms() -> None:
    assert parse_retry_after({"Retry-After": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    wait = parse_retry_after({"retry-after": later})
    assert wait is not None and 0 < wait <= 120
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


# --- Native tool calling ---------------------------------------------------------------------

RUN_CODE_ARGS = '{"code": "print(sum(range(11)))", "language": "python"}'
TOOL_CONVERSATION = [
    Message(role="system", content="You write Python."),
    Message(role="user", content="Sum 1..10"),
    Message(
        role="assistant",
        content="I will run it.",
        tool_calls=(ToolCall(id="call_a", name="run_code", arguments=RUN_CODE_ARGS),),
    ),
    Message(role="tool", content="Run 1 printed 55.", tool_call_id="call_a"),
]


def _chat_tool_call(name: str, arguments: str, call_id: str = "call_b") -> Reply:
    return Reply(
        body={
            "id": "chatcmpl-2",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-test-2025",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": arguments},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62},
        }
    )


def _no_tools_400(provider: str) -> Reply:
    # What servers without tool calling answer (llama.cpp, older Ollama and vLLM builds).
    message = "tools is not supported by this model"
    if provider == "anthropic":
        return Reply(
            status=400,
            body={"type": "error", "error": {"type": "invalid_request_error", "message": message}},
        )
    return Reply(status=400, body={"error": {"message": message, "type": "invalid_request_error"}})


def test_openai_tools_go_out_and_tool_calls_come_back(
    server: ProviderServer, chat: OpenAIChatModel
) -> None:
    answer_args = '{"explanation": "The sum is 55.", "figures": [{"name": "sum", "value": 55.0}]}'
    server.reply = lambda _r: _chat_tool_call("answer", answer_args)
    assert chat.tool_calling == "auto"
    done = chat.complete(TOOL_CONVERSATION, max_tokens=100, tools=TOOLS)
    assert done.tool_calls == (ToolCall(id="call_b", name="answer", arguments=answer_args),)
    assert (done.text, done.finish_reason) == ("", "tool_calls")
    body = server.requests[0].body
    tools = body["tools"]
    assert isinstance(tools, list)
    assert [t["function"]["name"] for t in tools] == ["run_code", "answer"]
    assert all(t["type"] == "function" for t in tools)
    assert tools[0]["function"]["parameters"]["required"] == ["code"]
    # The earlier call and its result are on the wire in OpenAI's shape.
    assert body["messages"][2] == {
        "role": "assistant",
        "content": "I will run it.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "run_code", "arguments": RUN_CODE_ARGS},
            }
        ],
    }
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": "Run 1 printed 55.",
    }


def test_openai_text_mode_sends_no_tools(server: ProviderServer) -> None:
    server.reply = lambda _r: _chat_ok()
    with OpenAIChatModel("m", api_key="k", base_url=server.url, tool_calling="text") as model:
        model.complete(CONVERSATION, max_tokens=10, tools=TOOLS)
    assert "tools" not in server.requests[0].body


def test_openai_server_without_tools_switches_auto_to_text(
    server: ProviderServer, chat: OpenAIChatModel
) -> None:
    server.reply = lambda r: _no_tools_400("openai") if "tools" in r.body else _chat_ok()
    with pytest.raises(ToolsUnsupported, match="refused tool calling") as exc:
        chat.complete(CONVERSATION, max_tokens=10, tools=TOOLS)
    assert exc.value.status == 400 and "tools is not supported" in str(exc.value)
    assert chat.tool_calling == "text"
    # From now on the same call goes out as plain text, and the server answers it.
    assert chat.complete(CONVERSATION, max_tokens=10, tools=TOOLS).text == "The sum is 55."
    assert "tools" not in server.requests[1].body


def test_openai_native_mode_does_not_fall_back(server: ProviderServer) -> None:
    server.reply = lambda _r: _no_tools_400("openai")
    with (
        OpenAIChatModel("m", api_key="k", base_url=server.url, tool_calling="native") as model,
        pytest.raises(ModelError, match="--tool-calling text") as exc,
    ):
        model.complete(CONVERSATION, max_tokens=10, tools=TOOLS)
    assert not isinstance(exc.value, ToolsUnsupported)
    assert model.tool_calling == "native"


def test_openai_other_bad_request_with_tools_is_not_a_fallback(
    server: ProviderServer, chat: OpenAIChatModel
) -> None:
    server.reply = lambda _r: Reply(status=400, body={"error": {"message": "bad max_tokens"}})
    with pytest.raises(ModelError) as exc:
        chat.complete(CONVERSATION, max_tokens=10, tools=TOOLS)
    assert not isinstance(exc.value, ToolsUnsupported)
    assert chat.tool_calling == "auto"


def _anthropic_tool_use(name: str, arguments: dict[str, object]) -> Reply:
    return Reply(
        body={
            "id": "msg_2",
            "type": "message",
            "role": "assistant",
            "model": "claude-test-20250101",
            "content": [
                {"type": "text", "text": "Running it."},
                {"type": "tool_use", "id": "toolu_9", "name": name, "input": arguments},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 40, "output_tokens": 20},
        }
    )


def test_anthropic_tools_go_out_and_tool_use_comes_back(
    server: ProviderServer, claude: AnthropicMessagesModel
) -> None:
    server.reply = lambda _r: _anthropic_tool_use("run_code", {"code": "print(2)"})
    conversation = [
        *TOOL_CONVERSATION,
        Message(role="user", content="Note: be brief."),
    ]
    done = claude.complete(conversation, max_tokens=100, tools=TOOLS)
    assert done.text == "Running it." and done.finish_reason == "tool_use"
    (call,) = done.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == (
        "toolu_9",
        "run_code",
        {"code": "print(2)"},
    )
    body = server.requests[0].body
    tools = body["tools"]
    assert isinstance(tools, list)
    assert [t["name"] for t in tools] == ["run_code", "answer"]
    assert tools[1]["input_schema"]["required"] == ["explanation"]
    messages = body["messages"]
    assert isinstance(messages, list)
    assert messages[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "I will run it."},
            {
                "type": "tool_use",
                "id": "call_a",
                "name": "run_code",
                "input": json.loads(RUN_CODE_ARGS),
            },
        ],
    }
    # The tool's result leads the next user turn; the user's own text follows it.
    assert messages[2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_a", "content": "Run 1 printed 55."},
            {"type": "text", "text": "Note: be brief."},
        ],
    }


def test_anthropic_server_without_tools_switches_auto_to_text(
    server: ProviderServer, claude: AnthropicMessagesModel
) -> None:
    server.reply = lambda r: (
        _no_tools_400("anthropic") if "tools" in r.body else (_anthropic_reply(r))
    )
    with pytest.raises(ToolsUnsupported):
        claude.complete(CONVERSATION, max_tokens=10, tools=TOOLS)
    assert claude.tool_calling == "text"
    assert claude.complete(CONVERSATION, max_tokens=10, tools=TOOLS).text == "The sum is 55."
    assert "tools" not in server.requests[1].body


def test_tool_calling_is_configured_by_flag_and_file(
    server: ProviderServer, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[model]\nname = "openai-compatible:m"\ntool_calling = "text"\n')
    model, settings = resolve_model_and_settings(
        None, base_url=server.url, environ={}, config_file=config
    )
    assert settings.tool_calling == "text" and model.tool_calling == "text"  # type: ignore[attr-defined]
    model, settings = resolve_model_and_settings(
        "openai-compatible:m", base_url=server.url, environ={}, tool_calling="native"
    )
    assert settings.to_dict()["tool_calling"] == "native"
    assert model.tool_calling == "native"  # type: ignore[attr-defined]
    config.write_text('[model]\ntool_calling = "sometimes"\n')
    with pytest.raises(ConfigError, match="tool_calling must be one of auto, native, text"):
        resolve_model_and_settings("openai-compatible:m", base_url=server.url, environ={},
                                   config_file=config)  # fmt: skip
