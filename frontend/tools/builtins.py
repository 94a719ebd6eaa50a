"""The built-in tools of both MCP endpoints: their definitions, and one handler each."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

from mcpvisor.frontend.door.control import ControlClient
from mcpvisor.frontend.door.upstreams import NotFound, Upstreams
from mcpvisor.frontend.tool_args import ToolInputError, check_parameters, error_result
from mcpvisor.frontend.tools.builtin_calls import VARIANTS, ToolCaller, call_tool_definition
from mcpvisor.frontend.tools.code_execution import (
    CODE_EXECUTION_TOOL,
    CodeExecution,
    Confinement,
    Limits,
    scripts_dir_for,
    tool_definition,
)
from mcpvisor.frontend.tools.describe import DESCRIBE_TOOL, describe_tools
from mcpvisor.frontend.tools.management import UPSTREAM_SERVERS_TOOL, UPSTREAM_TOOL_NAME, UpstreamServers
from mcpvisor.frontend.tools.proxy_backend import UpstreamsProxyBackend, serve_proxy
from mcpvisor.frontend.tools.quarantine import QUARANTINE_SECURITY_TOOL, QUARANTINE_TOOL_NAME, QuarantineSecurity
from mcpvisor.frontend.tools.registries import (
    LIST_REGISTRIES_TOOL,
    SEARCH_SERVERS_TOOL,
    AddFromRegistry,
    answer_list_registries,
    answer_search_servers,
    with_add_from_registry,
)
from mcpvisor.frontend.tools.response_cache import (
    READ_CACHE_TOOL,
    READ_CACHE_TOOL_NAME,
    ResponseCache,
    cut_result,
    read_cache,
)
from mcpvisor.frontend.tools.retrieval import DESCRIBE_TOOL_NAME, RETRIEVE_TOOL_NAME, retrieve_tool, retrieve_tools
from mcpvisor.wire.config import RegistryConfig, SearchConfig
from mcpvisor.wire.proxy import PROXY_TOOL, PROXY_TOOL_NAME

# The search workflow only makes sense where upstream tools are not listed (seed 003, FR-003).
SEARCH_WORKFLOW_TOOLS: Final = (RETRIEVE_TOOL_NAME, DESCRIBE_TOOL_NAME, *VARIANTS)
LIST_REGISTRIES: Final = LIST_REGISTRIES_TOOL["name"]
SEARCH_SERVERS: Final = SEARCH_SERVERS_TOOL["name"]
# code_execution is listed only with enable_code_execution = true (see `definitions`).
MANAGEMENT_TOOLS: Final = (
    UPSTREAM_TOOL_NAME,
    QUARANTINE_TOOL_NAME,
    READ_CACHE_TOOL_NAME,
    CODE_EXECUTION_TOOL,
    LIST_REGISTRIES,
    SEARCH_SERVERS,
)
SEARCH_ENDPOINT_TOOLS: Final = (*SEARCH_WORKFLOW_TOOLS, *MANAGEMENT_TOOLS, PROXY_TOOL_NAME)

# A handler takes the tool's arguments and the client's request context (for progress, logs and
# questions of the upstream call it makes, if any).
Handler = Callable[[Mapping[str, Any], Any], Awaitable[dict[str, Any]]]


class Builtins:
    """Definitions and handlers of every built-in tool, shared by both endpoints."""

    def __init__(
        self,
        upstreams: Upstreams,
        control: ControlClient,
        cache: ResponseCache,
        *,
        registries: Mapping[str, RegistryConfig] | None = None,
        config_path: str = "",
        search: SearchConfig | None = None,
        confinement: Confinement | None = None,
    ) -> None:
        settings = upstreams.settings
        search = search or SearchConfig()
        caller = ToolCaller(upstreams, cache)
        proxy_backend = UpstreamsProxyBackend(upstreams)

        async def retrieve(arguments: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
            return await retrieve_tools(upstreams, arguments, search)

        async def describe(arguments: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
            return await describe_tools(upstreams, arguments)

        async def page(arguments: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
            return read_cache(cache, arguments, page_size=settings.tool_response_limit)

        async def proxy(arguments: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
            return await serve_proxy(proxy_backend, arguments)

        configured = dict(registries or {})

        async def list_registries(arguments: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
            check_parameters(arguments, (), what=LIST_REGISTRIES)
            return answer_list_registries(configured)

        async def search_servers(arguments: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
            return await answer_search_servers(
                arguments, configured, allow_private=settings.allow_private_registry_fetch
            )

        def variant(name: str) -> Handler:
            async def call(arguments: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
                return await caller.call(name, arguments, ctx)

            return call

        self._handlers: dict[str, Handler] = {
            RETRIEVE_TOOL_NAME: retrieve,
            DESCRIBE_TOOL_NAME: describe,
            **{name: variant(name) for name in VARIANTS},
            UPSTREAM_TOOL_NAME: AddFromRegistry(
                UpstreamServers(upstreams, control), configured, allow_private=settings.allow_private_registry_fetch
            ),
            QUARANTINE_TOOL_NAME: QuarantineSecurity(upstreams, control),
            READ_CACHE_TOOL_NAME: page,
            PROXY_TOOL_NAME: proxy,
            LIST_REGISTRIES: list_registries,
            SEARCH_SERVERS: search_servers,
        }
        self._definitions: dict[str, dict[str, Any]] = {
            RETRIEVE_TOOL_NAME: retrieve_tool(settings.tools_limit, search),
            DESCRIBE_TOOL_NAME: DESCRIBE_TOOL,
            **{name: call_tool_definition(name) for name in VARIANTS},
            UPSTREAM_TOOL_NAME: with_add_from_registry(UPSTREAM_SERVERS_TOOL),
            QUARANTINE_TOOL_NAME: QUARANTINE_SECURITY_TOOL,
            READ_CACHE_TOOL_NAME: READ_CACHE_TOOL,
            PROXY_TOOL_NAME: PROXY_TOOL,
            LIST_REGISTRIES: LIST_REGISTRIES_TOOL,
            SEARCH_SERVERS: SEARCH_SERVERS_TOOL,
        }
        self.code_execution: CodeExecution | None = None
        if settings.enable_code_execution:
            self.code_execution = CodeExecution(
                upstreams,
                scripts_dir_for(config_path),
                Limits.from_settings(settings),
                confinement=confinement or Confinement(),
            )
            code_execution = self.code_execution

            async def run_code(arguments: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
                # A long answer is cut like an upstream's, the rest paged with read_cache.
                return cut_result(await code_execution(arguments, ctx), settings.tool_response_limit, cache)

            self._handlers[CODE_EXECUTION_TOOL] = run_code
            self._definitions[CODE_EXECUTION_TOOL] = tool_definition()

    def definitions(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """Tool definitions (MCP wire dicts) of the named built-ins, in that order; one turned off is left out."""
        return [self._definitions[name] for name in names if name in self._definitions]

    def offers(self, name: str) -> bool:
        """Whether `name` is one of the built-in tools turned on here."""
        return name in self._handlers

    def input_schema(self, name: str) -> dict[str, Any] | None:
        definition = self._definitions.get(name)
        return definition["inputSchema"] if definition is not None else None

    async def aclose(self) -> None:
        """Stop the code_execution sandboxes (they also end with this process)."""
        if self.code_execution is not None:
            await self.code_execution.aclose()

    async def call(self, name: str, arguments: Mapping[str, Any] | None, ctx: Any = None) -> dict[str, Any]:
        """Run a built-in tool; a problem the caller can fix comes back as an `isError` result."""
        handler = self._handlers.get(name)
        if handler is None:
            raise NotFound("tool", name, "it is not one of mcpvisor's tools here")
        try:
            return await handler(arguments or {}, ctx)
        except (ToolInputError, NotFound) as exc:
            return error_result(exc.message)
