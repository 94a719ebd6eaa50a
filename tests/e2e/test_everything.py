"""mcpvisor in front of the reference server-everything, checked with the SDK and the MCP Inspector.

Given one stack with server-everything twice, `ev` over stdio and `evhttp` over streamable HTTP,
clients of both protocol eras on `/mcp/direct` see its tools, resources, templates and prompts
as a direct connection to the same server-everything does, and get the same results.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client
from pydantic import BaseModel, TypeAdapter

from tests.support.peers import everything_stdio_server, inspector_cli, open_everything_http
from tests.support.stack import Stack, open_stack

MODES = ("legacy", "auto")
SERVERS = ("ev", "evhttp")
# Registered whatever the client's capabilities (others depend on sampling, elicitation, roots).
CORE_TOOLS = {"echo", "get-annotated-message", "get-structured-content", "get-sum", "get-tiny-image"}
FEATURES_DOC = "demo://resource/static/document/features.md"
TEXT_TEMPLATE = "demo://resource/dynamic/text/{resourceId}"
BLOB_TEMPLATE = "demo://resource/dynamic/blob/{resourceId}"
CHICAGO = {"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82}
_RESULT = TypeAdapter(dict[str, Any])


@dataclass
class Everything:
    """A stack fronting server-everything over stdio (`ev`) and HTTP (`evhttp`), and that HTTP server's URL."""

    stack: Stack
    upstream_url: str

    def direct(self) -> Client:
        """An SDK client connected to the HTTP server-everything itself, not through mcpvisor."""
        return Client(self.upstream_url, mode="legacy")


@pytest.fixture
async def everything(tmp_path: Path) -> AsyncIterator[Everything]:
    async with open_everything_http(tmp_path) as url:
        servers = {"ev": everything_stdio_server(), "evhttp": {"url": url}}
        async with open_stack(tmp_path, servers) as stack:
            yield Everything(stack, url)


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def wire_json(value: Any) -> str:
    """A canonical JSON text, so `1` and `1.0` or a re-encoded string would differ."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


async def raw_call(client: Client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tools/call result as it came over the wire, unknown keys and all."""
    request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))
    with trio.fail_after(15):
        return await client.session.send_request(request, _RESULT)


def in_era(definition: dict[str, Any], mode: str) -> dict[str, Any]:
    """A handshake-era definition as a client of `mode` sees it: 2026-07-28 has no `execution` (tasks)."""
    return definition if mode == "legacy" else {k: v for k, v in definition.items() if k != "execution"}


async def test_tools_are_listed_prefixed_with_definitions_and_structured_content_unchanged(
    everything: Everything,
) -> None:
    async with everything.direct() as direct:
        upstream = {tool.name: dump(tool) for tool in (await direct.list_tools()).tools}
        upstream_weather = await direct.call_tool("get-structured-content", {"location": "Chicago"})
    assert set(upstream) >= CORE_TOOLS
    assert upstream["get-structured-content"]["outputSchema"]["required"] == ["temperature", "conditions", "humidity"]
    assert upstream_weather.structured_content == CHICAGO
    for mode in MODES:
        async with everything.stack.client(mode=mode) as client:
            proxied = {tool.name: dump(tool) for tool in (await client.list_tools()).tools}
            by_server = {
                server: {name.removeprefix(f"{server}:") for name in proxied if name.startswith(f"{server}:")}
                for server in SERVERS
            }
            # Over stdio and over HTTP, the same server offers the same tools.
            assert by_server["ev"] == by_server["evhttp"], mode
            assert set(upstream) <= by_server["ev"], mode
            for server in SERVERS:
                for name, definition in upstream.items():
                    assert proxied[f"{server}:{name}"] == in_era({**definition, "name": f"{server}:{name}"}, mode)
                weather_tool = proxied[f"{server}:get-structured-content"]
                assert weather_tool["outputSchema"] == upstream["get-structured-content"]["outputSchema"]

                weather = await client.call_tool(f"{server}:get-structured-content", {"location": "Chicago"})
                assert not weather.is_error
                assert weather.structured_content == CHICAGO, (mode, server)
                assert [dump(c) for c in weather.content] == [dump(c) for c in upstream_weather.content]


IMAGE_CALLS = [("get-tiny-image", {})] + [
    ("get-annotated-message", {"messageType": kind, "includeImage": True}) for kind in ("error", "success", "debug")
]


async def test_image_and_annotated_content_equal_what_a_direct_connection_gets(everything: Everything) -> None:
    async with everything.direct() as direct:
        upstream = [[dump(c) for c in (await direct.call_tool(n, a)).content] for n, a in IMAGE_CALLS]
    assert [block["type"] for block in upstream[0]] == ["text", "image", "text"]
    assert base64.b64decode(upstream[0][1]["data"]).startswith(b"\x89PNG")
    assert upstream[1][0]["annotations"] == {"priority": 1.0, "audience": ["user", "assistant"]}
    for mode in MODES:
        async with everything.stack.client(mode=mode) as client:
            for server in SERVERS:
                for (name, arguments), expected in zip(IMAGE_CALLS, upstream, strict=True):
                    result = await client.call_tool(f"{server}:{name}", arguments)
                    assert not result.is_error
                    assert [dump(c) for c in result.content] == expected, (mode, server, name)
                annotated = await client.call_tool(f"{server}:get-annotated-message", {"messageType": "debug"})
                [block] = annotated.content
                assert block.type == "text"
                assert block.annotations is not None
                assert (block.annotations.audience, block.annotations.priority) == (["assistant"], 0.3)


async def test_content_json_reaches_clients_as_the_upstream_sent_it(everything: Everything) -> None:
    async with everything.direct() as direct:
        upstream = [wire_json((await raw_call(direct, n, a))["content"]) for n, a in IMAGE_CALLS]
    assert '"annotations": {"audience": ["user", "assistant"], "priority": 1}' in upstream[1]
    proxied: dict[tuple[str, str], list[str]] = {}
    for mode in MODES:
        async with everything.stack.client(mode=mode) as client:
            for server in SERVERS:
                proxied[mode, server] = [
                    wire_json((await raw_call(client, f"{server}:{n}", a))["content"]) for n, a in IMAGE_CALLS
                ]
    for key, contents in proxied.items():
        assert contents == upstream, key


async def test_resources_and_templates_are_listed_and_read(everything: Everything) -> None:
    async with everything.direct() as direct:
        upstream_resources = [dump(r) for r in (await direct.list_resources()).resources]
        upstream_templates = [dump(t) for t in (await direct.list_resource_templates()).resource_templates]
        upstream_doc = dump(await direct.read_resource(FEATURES_DOC))
    assert FEATURES_DOC in {r["uri"] for r in upstream_resources}
    assert {t["uriTemplate"] for t in upstream_templates} == {TEXT_TEMPLATE, BLOB_TEMPLATE}
    for mode in MODES:
        async with everything.stack.client(mode=mode) as client:
            resources = [dump(r) for r in (await client.list_resources()).resources]
            assert {r["uri"] for r in resources} == {r["uri"] for r in upstream_resources}, mode
            assert all(r in resources for r in upstream_resources), mode
            templates = [dump(t) for t in (await client.list_resource_templates()).resource_templates]
            assert {t["uriTemplate"] for t in templates} == {TEXT_TEMPLATE, BLOB_TEMPLATE}, mode
            assert all(t in templates for t in upstream_templates), mode

            doc = await client.read_resource(FEATURES_DOC)
            assert [dump(c) for c in doc.contents] == upstream_doc["contents"]
            assert doc.contents[0].text.startswith("# Everything Server - Features")

            [text] = (await client.read_resource("demo://resource/dynamic/text/2")).contents
            assert isinstance(text, types.TextResourceContents)
            assert text.uri == "demo://resource/dynamic/text/2"
            assert text.text.startswith("Resource 2: This is a plaintext resource created at")

            [blob] = (await client.read_resource("demo://resource/dynamic/blob/3")).contents
            assert isinstance(blob, types.BlobResourceContents)
            assert (blob.uri, blob.mime_type) == ("demo://resource/dynamic/blob/3", "text/plain")
            assert base64.b64decode(blob.blob).startswith(b"Resource 3: This is a base64 blob created at")


async def test_prompts_are_listed_prefixed_and_get_passes_arguments(everything: Everything) -> None:
    async with everything.direct() as direct:
        upstream = {p.name: dump(p) for p in (await direct.list_prompts()).prompts}
        upstream_args = dump(await direct.get_prompt("args-prompt", {"city": "Oslo", "state": "Viken"}))
    assert {"simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"} <= set(upstream)
    for mode in MODES:
        async with everything.stack.client(mode=mode) as client:
            prompts = {p.name: dump(p) for p in (await client.list_prompts()).prompts}
            assert set(prompts) == {f"{server}:{name}" for server in SERVERS for name in upstream}, mode
            for server in SERVERS:
                for name, definition in upstream.items():
                    assert prompts[f"{server}:{name}"] == {**definition, "name": f"{server}:{name}"}

                got = await client.get_prompt(f"{server}:args-prompt", {"city": "Oslo", "state": "Viken"})
                assert [dump(m) for m in got.messages] == upstream_args["messages"]
                assert got.messages[0].content.text == "What's weather in Oslo, Viken?"
                without_state = await client.get_prompt(f"{server}:args-prompt", {"city": "Bergen"})
                assert without_state.messages[0].content.text == "What's weather in Bergen?"

                embedded = await client.get_prompt(
                    f"{server}:resource-prompt", {"resourceType": "Blob", "resourceId": "4"}
                )
                assert [m.content.type for m in embedded.messages] == ["text", "resource"]
                resource = embedded.messages[1].content.resource
                assert resource.uri == "demo://resource/dynamic/blob/4"
                assert base64.b64decode(resource.blob).startswith(b"Resource 4: ")


async def test_completion_of_prompt_and_template_arguments_is_forwarded(everything: Everything) -> None:
    def prompt(name: str) -> types.PromptReference:
        return types.PromptReference(type="ref/prompt", name=name)

    template = types.ResourceTemplateReference(type="ref/resource", uri=TEXT_TEMPLATE)
    async with everything.direct() as direct:
        upstream = await direct.complete(prompt("completable-prompt"), {"name": "department", "value": "S"})
    assert upstream.completion.values == ["Sales", "Support"]
    for mode in MODES:
        async with everything.stack.client(mode=mode) as client:
            for server in SERVERS:
                ref = prompt(f"{server}:completable-prompt")
                departments = await client.complete(ref, {"name": "department", "value": "S"})
                assert dump(departments.completion) == dump(upstream.completion), (mode, server)
                # The second argument's values depend on the first, sent as context.
                leads = await client.complete(ref, {"name": "name", "value": ""}, {"department": "Engineering"})
                assert leads.completion.values == ["Alice", "Bob", "Charlie"], (mode, server)
            ids = await client.complete(template, {"name": "resourceId", "value": "7"})
            assert ids.completion.values == ["7"], mode


async def inspect_all(url: str, requests: dict[tuple[str, str], tuple[str, ...]]) -> dict[tuple[str, str], Any]:
    """Run Inspector CLI requests, keyed (protocol era, label), side by side; their results by the same keys."""
    results: dict[tuple[str, str], Any] = {}

    async def run(key: tuple[str, str], method: str, *args: str) -> None:
        era = key[0]
        results[key] = await trio.to_thread.run_sync(lambda: inspector_cli(url, method, *args, "--protocol-era", era))

    async with trio.open_nursery() as nursery:
        for key, (method, *args) in requests.items():
            nursery.start_soon(run, key, method, *args)
    return results


async def test_inspector_cli_lists_calls_reads_and_gets_through_mcpvisor(everything: Everything) -> None:
    async with everything.direct() as direct:
        upstream_tool = next(t for t in (await direct.list_tools()).tools if t.name == "get-structured-content")
        upstream_annotated = await direct.call_tool(
            "get-annotated-message", {"messageType": "error", "includeImage": True}
        )
        upstream_uris = {r.uri for r in (await direct.list_resources()).resources}
        upstream_doc = dump(await direct.read_resource(FEATURES_DOC))
        upstream_prompts = {p.name: dump(p) for p in (await direct.list_prompts()).prompts}

    eras = ("legacy", "modern")
    requests: dict[tuple[str, str], tuple[str, ...]] = {}
    for era in eras:
        requests[era, "tools"] = ("tools/list",)
        for server in SERVERS:
            requests[era, f"{server}:weather"] = (
                "tools/call",
                "--tool-name",
                f"{server}:get-structured-content",
                "--tool-arg",
                "location=Chicago",
            )
            requests[era, f"{server}:annotated"] = (
                "tools/call",
                "--tool-name",
                f"{server}:get-annotated-message",
                "--tool-arg",
                "messageType=error",
                "includeImage=true",
            )
        requests[era, "resources"] = ("resources/list",)
        requests[era, "doc"] = ("resources/read", "--uri", FEATURES_DOC)
        requests[era, "prompts"] = ("prompts/list",)
        requests[era, "prompt"] = (
            "prompts/get",
            "--prompt-name",
            "evhttp:args-prompt",
            "--prompt-args",
            "city=Oslo",
            "state=Viken",
        )
    results = await inspect_all(everything.stack.direct_url, requests)

    for era in eras:
        tools = {tool["name"]: tool for tool in results[era, "tools"]["tools"]}
        for server in SERVERS:
            assert {f"{server}:{name}" for name in CORE_TOOLS} <= set(tools), era
            assert tools[f"{server}:get-structured-content"]["outputSchema"] == upstream_tool.output_schema, era
            assert results[era, f"{server}:weather"]["structuredContent"] == CHICAGO, (era, server)
            annotated = results[era, f"{server}:annotated"]["content"]
            assert annotated == [dump(c) for c in upstream_annotated.content], (era, server)

        assert {r["uri"] for r in results[era, "resources"]["resources"]} == upstream_uris, era
        assert results[era, "doc"]["contents"] == upstream_doc["contents"], era

        prompts = {p["name"]: p for p in results[era, "prompts"]["prompts"]}
        assert prompts.keys() == {f"{server}:{name}" for server in SERVERS for name in upstream_prompts}, era
        assert prompts["ev:args-prompt"] == {**upstream_prompts["args-prompt"], "name": "ev:args-prompt"}, era
        text = {"type": "text", "text": "What's weather in Oslo, Viken?"}
        assert results[era, "prompt"]["messages"] == [{"role": "user", "content": text}], era
