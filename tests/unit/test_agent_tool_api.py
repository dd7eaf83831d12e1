"""Code mode: governed tools rendered as a typed Python API, and what the prompt says about the
network and tools a profile allows."""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from tests.unit.test_agent_paused import _task

from sandcell.agent._task import task_from_state, task_to_state
from sandcell.agent.prompt import system_prompt
from sandcell.agent.tool_api import (
    ToolOperation,
    list_operations,
    operations_from_listing,
    python_type,
    render_api,
    render_stub,
)
from sandcell.agent.tools import TOOLS, tools_for
from sandcell.errors import ConfigError
from sandcell.policy.profiles import Profile, load_profile, parse_profile

SERVER = Path(__file__).resolve().parents[1] / "mcp_ticket_server.py"

WEATHER = """
[tools.weather]
kind = "http"
description = "Forecasts."
base_url = "http://127.0.0.1:9/v1"
allow = ["GET /forecast/*"]
credential_env = "SANDCELL_TEST_WEATHER_KEY"
"""


def profile(text: str) -> Profile:
    return parse_profile(text.encode(), name="p", source="test")


def op(schema: Mapping[str, object] | None, **kw: object) -> ToolOperation:
    fields: dict[str, object] = {"name": "t.op", "kind": "mcp", "input_schema": schema} | kw
    return ToolOperation(**fields)  # type: ignore[arg-type]


def function(source: str) -> ast.FunctionDef:
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    return node


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, "str"),
        ({"type": "integer"}, "int"),
        ({"type": "number"}, "float"),
        ({"type": "boolean"}, "bool"),
        ({"type": "array"}, "list"),
        ({"type": "array", "items": {"type": "string"}}, "list[str]"),
        ({"type": "object"}, "dict"),
        ({"type": "object", "additionalProperties": {"type": "integer"}}, "dict[str, int]"),
        ({"type": "null"}, "None"),
        ({"type": ["string", "null"]}, "str | None"),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "int | None"),
        ({"anyOf": [{"type": "integer"}, {}]}, "Any"),
        ({"enum": ["open", "closed"]}, 'Literal["open", "closed"]'),
        ({"const": 3}, "Literal[3]"),
        ({"enum": [{"a": 1}]}, "Any"),
        ({"type": "weird"}, "Any"),
        ({}, "Any"),
        ("not a schema", "Any"),
    ],
)
def test_json_schema_types_become_python_annotations(schema: object, expected: str) -> None:
    assert python_type(schema) == expected


def test_a_stub_has_required_arguments_first_and_optional_ones_with_defaults() -> None:
    schema = {
        "type": "object",
        "properties": {
            "limit": {"type": "integer", "default": 10, "description": "How many."},
            "status": {"type": "string"},
            "query": {"type": "string"},
        },
        "required": ["query"],
    }
    text = render_stub(op(schema, name="tickets.search", description="Search."), function="f")
    node = function(text)
    args = node.args
    assert args.args == [] and args.vararg is None  # keyword-only: the call takes keywords
    assert [a.arg for a in args.kwonlyargs] == ["query", "limit", "status"]
    assert [ast.unparse(a.annotation) for a in args.kwonlyargs if a.annotation] == [
        "str",
        "int",
        "str | None",
    ]
    assert [d if d is None else ast.unparse(d) for d in args.kw_defaults] == [None, "10", "None"]
    doc = ast.get_docstring(node) or ""
    assert doc.startswith("Search.") and "limit: How many." in doc
    assert (
        doc.splitlines()[-1]
        == 'sandcell_tools.call("tickets.search", query=..., limit=..., status=...)'
    )


def test_names_that_are_not_python_go_through_kwargs() -> None:
    schema = {
        "type": "object",
        "properties": {"user-id": {"type": "string"}, "from": {"type": "string"}},
        "required": ["user-id"],
    }
    node = function(render_stub(op(schema), function="f"))
    assert node.args.kwarg is not None and node.args.kwarg.arg == "kwargs"
    doc = " ".join((ast.get_docstring(node) or "").split())
    assert "'user-id': str" in doc and "'from': str, optional" in doc


def test_an_unknown_schema_is_kwargs_and_says_why() -> None:
    node = function(render_stub(op(None, problem="the server failed"), function="f"))
    assert node.args.kwarg is not None and not node.args.kwonlyargs
    assert "could not be listed (the server failed)" in " ".join(
        (ast.get_docstring(node) or "").split()
    )


def test_a_description_cannot_break_out_of_its_docstring() -> None:
    evil = 'Hi."""\nimport os\nos.system("x")\n"""'
    text = render_api([op({"type": "object"}, description=evil)])
    tree = ast.parse(text)  # still valid Python
    assert not any(isinstance(n, ast.Import | ast.Expr) for n in tree.body)
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["t__op"]


def test_render_api_gives_unique_names_and_the_result_types() -> None:
    ops = [
        op({"type": "object"}, name="a.x-y"),
        op({"type": "object"}, name="a.x_y"),
        op({"type": "object"}, name="w.request", kind="http", approval="always"),
    ]
    text = render_api(ops)
    tree = ast.parse(text)
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert classes == ["HttpResult", "McpResult"]
    assert [f.name for f in functions] == ["a__x_y", "a__x_y_2", "w__request"]
    assert [ast.unparse(f.returns) for f in functions if f.returns] == [
        "McpResult",
        "McpResult",
        "HttpResult",
    ]
    assert "waits for a person's approval" in (ast.get_docstring(functions[2]) or "")


def test_a_listing_error_falls_back_to_the_allow_list() -> None:
    tools = profile(
        WEATHER + '\n[tools.tickets]\nkind = "mcp"\ncommand = ["x"]\nallow = ["search", "create"]\n'
        'approval = { create = "always" }\n'
    ).tools
    entries: list[Mapping[str, object]] = [
        {"name": "weather.request", "description": "d", "input_schema": {"type": "object"}},
        {"name": "tickets", "error": "tool tickets: the MCP server failed (OSError)"},
        {"name": "other.thing", "description": "not the profile's", "input_schema": {}},
    ]
    ops = operations_from_listing(entries, tools)
    assert [(o.name, o.kind, o.approval) for o in ops] == [
        ("weather.request", "http", "never"),
        ("tickets.search", "mcp", "never"),
        ("tickets.create", "mcp", "always"),
    ]
    assert ops[1].input_schema is None and "OSError" in (ops[1].problem or "")


def test_operations_survive_the_stored_conversation() -> None:
    first = op({"type": "object"}, approval="always", problem=None)
    assert ToolOperation.from_dict(first.to_dict()) == first
    with pytest.raises(ValueError):
        ToolOperation.from_dict({"name": "x", "kind": "ftp"})


def test_an_http_tool_is_listed_from_the_profile_alone() -> None:
    env = {"SANDCELL_TEST_WEATHER_KEY": "k-123"}
    (only,) = list_operations(profile(WEATHER), environ=env)
    assert (only.name, only.kind) == ("weather.request", "http")
    assert only.input_schema is not None and only.input_schema["required"] == ["method", "path"]
    assert "GET /forecast/*" in only.description
    assert list_operations(load_profile("strict")) == ()


def test_a_missing_credential_is_a_config_error_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match="SANDCELL_TEST_WEATHER_KEY"):
        list_operations(profile(WEATHER), environ={})


def test_an_mcp_tool_is_listed_with_the_servers_schema() -> None:
    pytest.importorskip("mcp", reason="the MCP SDK (extra 'tools') is not installed")
    text = (
        f'[tools.tickets]\nkind = "mcp"\ncommand = ["{sys.executable}", "{SERVER}", "stdio"]\n'
        'allow = ["search_tickets", "create_ticket", "not_on_the_server"]\n'
        'approval = { create_ticket = "always" }\n'
    )
    ops = list_operations(profile(text), environ={})
    assert [(o.name, o.approval) for o in ops] == [
        ("tickets.search_tickets", "never"),
        ("tickets.create_ticket", "always"),
    ]
    search = function(render_stub(ops[0], function="tickets__search_tickets"))
    assert ast.unparse(search.args) == "*, query: str, limit: int=10"


def test_the_prompt_says_no_network_without_an_allowlist() -> None:
    p = load_profile("strict")
    text = system_prompt(p, limits=p.limits.defaults, exports=[])
    assert "No network and no secrets." in text and "sandcell_tools" not in text
    assert "reaches for the network" in text
    (run_code, answer) = tools_for(p)
    assert (run_code.description, answer) == (TOOLS[0].description, TOOLS[1])


def test_the_prompt_lists_the_allowlisted_hosts() -> None:
    p = profile('[network]\nmode = "allowlist"\nhosts = ["pypi.org", "data.example.org:443"]\n')
    text = system_prompt(p, limits=p.limits.defaults, exports=[])
    assert "No network" not in text and "reaches for the network" not in text
    assert "pypi.org:443,80, data.example.org:443" in text and "https_proxy" in text
    (run_code, _) = tools_for(p)
    assert "no network" not in run_code.description and "proxy" in run_code.description


def test_the_prompt_shows_the_tools_as_an_api_and_asks_to_print_little() -> None:
    p = profile(WEATHER)
    ops = list_operations(p, environ={"SANDCELL_TEST_WEATHER_KEY": "k-123"})
    text = system_prompt(p, limits=p.limits.defaults, exports=[], operations=ops)
    assert "No network and no secrets." in text
    assert "import sandcell_tools" in text and "def weather__request(" in text
    assert 'sandcell_tools.call("weather.request", method=..., path=...' in text
    assert "Only what the program prints comes back to you" in text
    assert "k-123" not in text  # the credential stays on the host
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    ast.parse(block)
    assert "sandcell_tools.call" in tools_for(p)[0].description


def test_a_waiting_conversation_keeps_its_operations() -> None:
    listed = (op({"type": "object"}, name="t.a"), op(None, name="t.b", problem="down"))
    task = replace(_task(), operations=listed)
    state = task_to_state(task, model_settings={})
    assert task_from_state(state, profile=task.profile, budget=None).operations == listed
    del state["operations"]  # stored before tools were listed: none were shown
    assert task_from_state(state, profile=task.profile, budget=None).operations == ()
