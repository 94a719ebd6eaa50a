"""The fixture server of the MCP conformance suite's server scenarios, written with the Python SDK.

`python conformance_server.py [--http PORT]`: stdio by default, streamable HTTP (both protocol
eras, SSE resumability for the polling scenario) on 127.0.0.1:PORT/mcp with --http. Every tool,
resource and prompt is named and shaped as the scenarios of `@modelcontextprotocol/conformance`
(pinned in tests/peers) ask for; the scenario descriptions in that package are the specification.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import os
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

# A 1x1 red PNG and a minimal WAV (a header and no samples).
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV = base64.b64encode(
    b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (8000).to_bytes(4, "little")
    + (16000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    + b"data" + (0).to_bytes(4, "little")
).decode()  # fmt: skip

JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

NAME_QUESTION = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}


class MemoryEventStore(EventStore):
    """Keeps every SSE event so a client that reconnects with Last-Event-ID gets what it missed."""

    def __init__(self) -> None:
        self._events: list[tuple[str, str, types.JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        event_id = str(len(self._events) + 1)
        self._events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        stream = next((sid for sid, eid, _ in self._events if eid == last_event_id), None)
        if stream is None:
            return None
        for sid, eid, message in self._events:
            if sid == stream and int(eid) > int(last_event_id) and message is not None:
                await send_callback(EventMessage(message, eid))
        return stream


class UserInfo(BaseModel):
    username: str = Field(description="User's response")
    email: str = Field(description="User's email address")


class Defaults(BaseModel):
    name: str = Field(default="John Doe")
    age: int = Field(default=30)
    score: float = Field(default=95.5)
    status: str = Field(default="active", json_schema_extra={"enum": ["active", "inactive", "pending"]})
    verified: bool = Field(default=True)


class Enums(BaseModel):
    untitledSingle: str = Field(json_schema_extra={"enum": ["option1", "option2", "option3"]})
    titledSingle: str = Field(
        json_schema_extra={
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ]
        }
    )
    legacyEnum: str = Field(
        json_schema_extra={"enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]}
    )
    untitledMulti: list[str] = Field(
        json_schema_extra={"items": {"type": "string", "enum": ["option1", "option2", "option3"]}}
    )
    titledMulti: list[str] = Field(
        json_schema_extra={
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            }
        }
    )


APP_URI = "ui://conformance/app.html"
APP_MIME = "text/html;profile=mcp-app"
APP_HTML = "<!doctype html><title>conformance app</title><p>hello from a ui:// resource</p>"
APP_META = {"ui": {"csp": {"connectDomains": []}, "prefersBorder": True}}
APP_TOOL_META = {"ui": {"resourceUri": APP_URI, "visibility": ["model", "app"]}}


def _elicit(message: str, schema: dict[str, Any]) -> types.ElicitRequest:
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(text: str, max_tokens: int) -> types.CreateMessageRequest:
    return types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=text))],
            max_tokens=max_tokens,
        )
    )


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def _answer(ctx: Context, key: str) -> Any:
    """The client's answer to the input request `key` of the previous round, as plain JSON, or None."""
    responses = ctx.input_responses or {}
    answer = responses.get(key)
    return answer.model_dump(mode="json", by_alias=True, exclude_none=True) if answer is not None else None


async def _tell_handshake_era(ctx: Context, lists: str) -> None:
    """`ctx.notify_*_changed` reaches only 2026-07-28 listeners; a handshake-era client (mcpvisor's
    worker) hears of a change by a notification on its connection."""
    if ctx.request_context.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return
    session = ctx.session
    send = session.send_tool_list_changed if lists == "tools" else session.send_prompt_list_changed
    await send()


class _Round:
    """A tool's view of one round it answers itself: the answers and state it would get back."""

    def __init__(self, ctx: Context, responses: dict[str, Any] | None, state: str | None) -> None:
        self._ctx = ctx
        self.input_responses = responses
        self.request_state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


_ASK_RESULTS: dict[type[Any], type[Any]] = {
    types.ElicitRequest: types.ElicitResult,
    types.CreateMessageRequest: types.CreateMessageResult,
    types.ListRootsRequest: types.ListRootsResult,
}


async def _ask(ctx: Context, request: Any, answers: dict[str, Any], key: str) -> None:
    # A question the client cannot answer is left unanswered, as a 2026-07-28 client leaves it.
    with contextlib.suppress(MCPError):
        answers[key] = await ctx.session.send_request(request, _ASK_RESULTS[type(request)])


def both_eras(fn: Callable[[Any], Any]) -> Callable[[Context], Awaitable[Any]]:
    """A handler written for 2026-07-28 input_required rounds, answering a handshake-era client too.

    A handshake-era client (such as a proxy's worker) cannot take an input_required result, so the
    questions of each round go to it as requests over the connection, all of a round at once, and
    the handler runs again with the answers, as a 2026-07-28 client's retry would run it.
    """

    @functools.wraps(fn)
    async def handler(ctx: Context) -> Any:
        if ctx.request_context.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return fn(ctx)
        responses: dict[str, Any] | None = None
        state: str | None = None
        for _ in range(8):
            result = fn(_Round(ctx, responses, state))
            if not isinstance(result, types.InputRequiredResult):
                return result
            answers: dict[str, Any] = {}
            async with anyio.create_task_group() as group:
                for key, request in (result.input_requests or {}).items():
                    group.start_soon(_ask, ctx, request, answers, key)
            responses, state = answers, result.request_state
        raise MCPError(types.INTERNAL_ERROR, "too many rounds")

    return handler


def build() -> MCPServer:
    server = MCPServer("mcpvisor-conformance-fixture")
    subscriptions: set[str] = set()

    @server.tool(description="Answers with one text block.")
    def test_simple_text() -> str:
        return "This is a simple text response for testing."

    @server.tool(description="Answers with an image (a 1x1 PNG).")
    def test_image_content() -> list[types.ImageContent]:
        return [types.ImageContent(type="image", data=PNG, mime_type="image/png")]

    @server.tool(description="Answers with audio (a WAV without samples).")
    def test_audio_content() -> list[types.AudioContent]:
        return [types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]

    @server.tool(description="Answers with an embedded text resource.")
    def test_embedded_resource() -> list[types.EmbeddedResource]:
        return [
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
                ),
            )
        ]

    @server.tool(description="Answers with text, an image and an embedded resource.")
    def test_multiple_content_types() -> list[types.TextContent | types.ImageContent | types.EmbeddedResource]:
        return [
            types.TextContent(type="text", text="Multiple content types test:"),
            types.ImageContent(type="image", data=PNG, mime_type="image/png"),
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="test://mixed-content-resource",
                    mime_type="application/json",
                    text=json.dumps({"test": "data", "value": 123}),
                ),
            ),
        ]

    @server.tool(description="Sends three log messages at info level while it runs.")
    async def test_tool_with_logging(ctx: Context) -> str:
        await ctx.info("Tool execution started")
        await anyio.sleep(0.05)
        await ctx.info("Tool processing data")
        await anyio.sleep(0.05)
        await ctx.info("Tool execution completed")
        return "Tool with logging executed successfully"

    @server.tool(description="Always fails.")
    def test_error_handling() -> str:
        raise RuntimeError("This tool intentionally returns an error for testing")

    @server.tool(description="Reports progress 0, 50 and 100 of 100.")
    async def test_tool_with_progress(ctx: Context) -> str:
        for step in (0, 50, 100):
            await ctx.report_progress(step, 100, message=f"Completed step {step} of 100")
            if step < 100:
                await anyio.sleep(0.05)
        return "Progress tool completed"

    @server.tool(description="Asks the client's LLM to answer a prompt.")
    async def test_sampling(prompt: str, ctx: Context) -> str:
        result = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
            max_tokens=100,
        )
        content = result.content
        return f"LLM response: {content.text if isinstance(content, types.TextContent) else 'No response'}"

    @server.tool(description="Asks the user for a username and an email address.")
    async def test_elicitation(message: str, ctx: Context) -> str:
        result = await ctx.elicit(message=message, schema=UserInfo)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"User response: action={result.action}, content={content}"

    @server.tool(description="Asks the user with a form whose fields all have defaults (SEP-1034).")
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        result = await ctx.elicit(message="Please review your information", schema=Defaults)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"Elicitation completed: action={result.action}, content={content}"

    @server.tool(description="Asks the user with every kind of enum field (SEP-1330).")
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        result = await ctx.elicit(message="Please select options", schema=Enums)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"Elicitation completed: action={result.action}, content={content}"

    @server.tool(description="Closes its SSE stream mid-call; the client resumes it (SEP-1699).")
    async def test_reconnection(ctx: Context) -> str:
        await ctx.info("Before disconnect")
        await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        await ctx.info("After reconnect")
        return "Reconnection test completed"

    @server.tool(name="json_schema_2020_12_tool", description="Tool with JSON Schema 2020-12 features")
    def json_schema_tool(name: str | None = None) -> str:
        return "ok"

    server._tool_manager.get_tool("json_schema_2020_12_tool").parameters = JSON_SCHEMA_2020_12

    @server.tool(description="Asks for the user's name through an input_required result.")
    @both_eras
    def test_input_required_result_elicitation(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        answer = _answer(ctx, "user_name")
        if not isinstance(answer, dict) or answer.get("action") != "accept":
            return types.InputRequiredResult(input_requests={"user_name": _elicit("What is your name?", NAME_QUESTION)})
        return _text(f"Hello, {(answer.get('content') or {}).get('name', 'stranger')}!")

    @server.tool(description="Asks the client's LLM through an input_required result.")
    @both_eras
    def test_input_required_result_sampling(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        answer = _answer(ctx, "capital_question")
        if answer is None:
            return types.InputRequiredResult(
                input_requests={"capital_question": _sample("What is the capital of France?", 100)}
            )
        content = answer.get("content") or {}
        return _text(f"The model said: {content.get('text', '') if isinstance(content, dict) else content}")

    @server.tool(description="Asks for the client's roots through an input_required result.")
    @both_eras
    def test_input_required_result_list_roots(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        answer = _answer(ctx, "client_roots")
        if answer is None:
            return types.InputRequiredResult(input_requests={"client_roots": types.ListRootsRequest()})
        roots = [root.get("uri", "") for root in answer.get("roots", [])]
        return _text(f"Client roots: {', '.join(roots) or 'none'}")

    @server.tool(description="Asks for confirmation and checks the request state it gets back.")
    @both_eras
    def test_input_required_result_request_state(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        if ctx.request_state != "confirm-round-1" or _answer(ctx, "confirm") is None:
            return types.InputRequiredResult(
                input_requests={
                    "confirm": _elicit(
                        "Please confirm",
                        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
                    )
                },
                request_state="confirm-round-1",
            )
        return _text("state-ok: confirmed")

    @server.tool(description="Asks for an elicitation, a sampling and the roots at once.")
    @both_eras
    def test_input_required_result_multiple_inputs(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        keys = ("user_name", "greeting", "client_roots")
        if ctx.request_state != "multi-1" or any(_answer(ctx, key) is None for key in keys):
            return types.InputRequiredResult(
                input_requests={
                    "user_name": _elicit("What is your name?", NAME_QUESTION),
                    "greeting": _sample("Generate a greeting", 50),
                    "client_roots": types.ListRootsRequest(),
                },
                request_state="multi-1",
            )
        return _text("Received all inputs: user_name, greeting, client_roots")

    @server.tool(description="Asks two questions, one round each.")
    @both_eras
    def test_input_required_result_multi_round(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        if ctx.request_state == "round-2" and _answer(ctx, "step2") is not None:
            return _text("Completed both rounds")
        if ctx.request_state == "round-1" and _answer(ctx, "step1") is not None:
            return types.InputRequiredResult(
                input_requests={
                    "step2": _elicit(
                        "Step 2: What is your favorite color?",
                        {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]},
                    )
                },
                request_state="round-2",
            )
        return types.InputRequiredResult(
            input_requests={"step1": _elicit("Step 1: What is your name?", NAME_QUESTION)}, request_state="round-1"
        )

    @server.tool(description="Refuses a request state that was not the one it sent.")
    @both_eras
    def test_input_required_result_tampered_state(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        if ctx.request_state is None:
            return types.InputRequiredResult(
                input_requests={"confirm": _elicit("Please confirm", NAME_QUESTION)}, request_state="tamper-check"
            )
        return _text("state accepted")

    @server.tool(description="Needs the client's sampling capability; refuses a client without it (-32021).")
    def test_missing_capability(ctx: Context) -> str:
        capabilities = ctx.client_capabilities
        if capabilities is None or capabilities.sampling is None:
            data = types.MissingRequiredClientCapabilityErrorData(
                required_capabilities=types.ClientCapabilities(sampling=types.SamplingCapability())
            )
            raise MCPError(
                MISSING_REQUIRED_CLIENT_CAPABILITY,
                "this tool needs the client's sampling capability",
                data.model_dump(mode="json", by_alias=True, exclude_none=True),
            )
        return "the client can sample"

    @server.tool(description="Asks only for what the client declared it can answer (SEP-2322).")
    @both_eras
    def test_input_required_result_capabilities(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        capabilities = ctx.client_capabilities or types.ClientCapabilities()
        if ctx.input_responses:
            return _text(f"Received: {', '.join(sorted(ctx.input_responses))}")
        requests: dict[str, types.InputRequest] = {}
        if capabilities.sampling is not None:
            requests["capital_question"] = _sample("What is the capital of France?", 100)
        if capabilities.elicitation is not None:
            requests["user_name"] = _elicit("What is your name?", NAME_QUESTION)
        if capabilities.roots is not None:
            requests["client_roots"] = types.ListRootsRequest()
        if not requests:
            return _text("The client declared nothing to ask it with")
        return types.InputRequiredResult(input_requests=requests)

    @server.tool(description="Parameters mirrored in Mcp-Param-* headers (SEP-2243).")
    def test_custom_headers(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
        priority: Annotated[int, Field(json_schema_extra={"x-mcp-header": "Priority"})] = 0,
        query: str = "",
    ) -> str:
        return f"region={region} priority={priority} query={query}"

    @server.tool(description="Sends a log message while it runs (at the level the request opted in to).")
    async def test_logging_tool(ctx: Context) -> str:
        await ctx.info("test_logging_tool ran")
        return "logged"

    @server.tool(description="Asks the user a question mid-call (an input_required round on 2026-07-28).")
    @both_eras
    def test_streaming_elicitation(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        answer = _answer(ctx, "question")
        if answer is None:
            return types.InputRequiredResult(input_requests={"question": _elicit("What is your name?", NAME_QUESTION)})
        return _text(f"Answered: {answer.get('action')}")

    @server.tool(description="Adds or removes a tool, and says that the tool list changed.")
    async def test_trigger_tool_change(ctx: Context) -> str:
        if "test_dynamic_tool" in {tool.name for tool in server._tool_manager.list_tools()}:
            server.remove_tool("test_dynamic_tool")
        else:
            server.add_tool(lambda: "dynamic", name="test_dynamic_tool", description="A tool that comes and goes.")
        await ctx.notify_tools_changed()
        await _tell_handshake_era(ctx, "tools")
        return "tool list changed"

    @server.tool(description="Adds or removes a prompt, and says that the prompt list changed.")
    async def test_trigger_prompt_change(ctx: Context) -> str:
        if "test_dynamic_prompt" in {prompt.name for prompt in server._prompt_manager.list_prompts()}:
            server.remove_prompt("test_dynamic_prompt")
        else:
            server.prompt(name="test_dynamic_prompt", description="A prompt that comes and goes.")(lambda: "dynamic")
        await ctx.notify_prompts_changed()
        await _tell_handshake_era(ctx, "prompts")
        return "prompt list changed"

    @server.resource("test://static-text", name="static-text", description="A static text resource")
    def static_text() -> str:
        return "This is the content of the static text resource."

    @server.resource(
        "test://static-binary", name="static-binary", description="A static binary resource", mime_type="image/png"
    )
    def static_binary() -> bytes:
        return base64.b64decode(PNG)

    @server.resource(
        "test://template/{id}/data",
        name="template",
        description="A resource template with an id",
        mime_type="application/json",
    )
    def template(id: str) -> str:
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    # Beyond the suite: what a proxy must pass through unchanged (mcpvisor's own tests use these).
    @server.tool(description="Answers with the _meta of the request it got, as JSON.")
    def test_request_meta(ctx: Context) -> str:
        meta = ctx.request_context.meta
        return json.dumps(dict(meta or {}))

    @server.tool(description="Answers with the Mcp-Method and Mcp-Name headers of its request (HTTP only).")
    def test_routing_headers(ctx: Context) -> str:
        headers = ctx.headers or {}
        return json.dumps({name: headers.get(name) for name in ("mcp-method", "mcp-name")})

    @server.tool(description="An MCP App: its UI is the ui:// resource its _meta points at.", meta=APP_TOOL_META)
    def test_app_tool() -> str:
        return "app tool ran"

    @server.resource(APP_URI, name="app", description="The UI of test_app_tool", mime_type=APP_MIME, meta=APP_META)
    def app() -> str:
        return APP_HTML

    @server.resource("test://watched-resource", name="watched-resource", description="A resource to subscribe to")
    def watched() -> str:
        return "Watched resource content"

    @server.prompt(description="A prompt without arguments")
    def test_simple_prompt() -> list[UserMessage]:
        return [UserMessage(types.TextContent(type="text", text="This is a simple prompt for testing."))]

    @server.prompt(description="A prompt with two required arguments")
    def test_prompt_with_arguments(
        arg1: Annotated[str, Field(description="First test argument")],
        arg2: Annotated[str, Field(description="Second test argument")],
    ) -> list[UserMessage]:
        text = f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"
        return [UserMessage(types.TextContent(type="text", text=text))]

    @server.prompt(description="A prompt that embeds a resource")
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        return [
            UserMessage(
                types.EmbeddedResource(
                    type="resource",
                    resource=types.TextResourceContents(
                        uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
                    ),
                ),
            ),
            UserMessage(types.TextContent(type="text", text="Please process the embedded resource above.")),
        ]

    @server.prompt(description="A prompt with an image")
    def test_prompt_with_image() -> list[UserMessage]:
        return [
            UserMessage(types.ImageContent(type="image", data=PNG, mime_type="image/png")),
            UserMessage(types.TextContent(type="text", text="Please analyze the image above.")),
        ]

    @server.prompt(description="A prompt that asks the user for its context first")
    @both_eras
    def test_input_required_result_prompt(ctx: Context) -> list[UserMessage] | types.InputRequiredResult:
        answer = _answer(ctx, "prompt_context")
        if not isinstance(answer, dict) or answer.get("action") != "accept":
            return types.InputRequiredResult(
                input_requests={
                    "prompt_context": _elicit(
                        "What context should the prompt use?",
                        {"type": "object", "properties": {"context": {"type": "string"}}, "required": ["context"]},
                    )
                }
            )
        context = (answer.get("content") or {}).get("context", "")
        return [UserMessage(types.TextContent(type="text", text=f"Context: {context}"))]

    @server.completion()
    async def complete(
        ref: types.PromptReference | types.ResourceTemplateReference,
        argument: types.CompletionArgument,
        context: types.CompletionContext | None,
    ) -> types.Completion:
        choices = ["paris", "park", "party"] if argument.name == "arg1" else []
        values = [choice for choice in choices if choice.startswith(argument.value)]
        return types.Completion(values=values, total=len(values), has_more=False)

    async def set_level(_ctx: Any, _params: types.SetLevelRequestParams) -> types.EmptyResult:
        return types.EmptyResult()

    async def subscribe(_ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        subscriptions.add(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(_ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        subscriptions.discard(str(params.uri))
        return types.EmptyResult()

    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, help="serve streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio")
    args = parser.parse_args()
    server = build()
    if args.http:
        # uvicorn picks its httptools protocol whenever httptools is installed (mcpvisor depends on it), and that
        # one keeps a header value's trailing whitespace, which RFC 9110 says a server must drop; h11 drops it.
        app = server.streamable_http_app(event_store=MemoryEventStore(), retry_interval=100)
        uvicorn.run(app, host="127.0.0.1", port=args.http, http="h11", log_level=server.settings.log_level.lower())
    else:
        server.run("stdio")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
