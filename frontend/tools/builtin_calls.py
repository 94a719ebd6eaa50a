"""`call_tool_read`, `call_tool_write`, `call_tool_destructive`: run an upstream tool, with a declared intent.

The variant is the caller's first key (clients can auto-approve reads and ask for the rest); the
server's `destructiveHint` is the second: read and write refuse a tool marked destructive. Every
call is logged with its intent, whatever its outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mcpvisor.frontend.door.calls import ClientCall
from mcpvisor.frontend.door.forwarding import decoded
from mcpvisor.frontend.door.upstreams import Refused, UpstreamError, Upstreams
from mcpvisor.frontend.tool_args import (
    ToolInputError,
    check_parameters,
    decode_json,
    error_result,
    get_string,
    json_type,
)
from mcpvisor.frontend.tools.response_cache import ResponseCache, cut_result

# Call tool name -> the operation type its intent must declare.
VARIANTS: Final[dict[str, str]] = {
    "call_tool_read": "read",
    "call_tool_write": "write",
    "call_tool_destructive": "destructive",
}
SENSITIVITIES: Final = ("public", "internal", "private", "unknown")
MAX_REASON: Final = 1000
_PARAMETERS: Final = ("name", "args", "args_json", "intent")
_INTENT_FIELDS: Final = ("operation_type", "data_sensitivity", "reason")

_PURPOSE: Final[dict[str, tuple[str, str]]] = {
    "read": (
        "Call a read-only upstream tool: one that queries data without changing anything.",
        "Refused for tools the server marks destructiveHint: true.",
    ),
    "write": (
        "Call an upstream tool that creates or updates something.",
        "Refused for tools the server marks destructiveHint: true.",
    ),
    "destructive": (
        "Call an upstream tool that deletes or irreversibly changes something.",
        "Allowed for any tool, whatever the server's annotations.",
    ),
}

_HINTS: Final[dict[str, dict[str, bool]]] = {
    "read": {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": True},
    "write": {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": True},
    "destructive": {"readOnlyHint": False, "destructiveHint": True, "openWorldHint": True},
}


def call_tool_definition(variant: str) -> dict[str, Any]:
    """The tool definition of one call variant (`call_tool_read`, ...)."""
    operation = VARIANTS[variant]
    purpose, rule = _PURPOSE[operation]
    return {
        "name": variant,
        "description": (
            f"{purpose} {rule} Find tools and the variant to use (`call_with`) with retrieve_tools. "
            "Pass the tool's arguments as an object in `args`, or as a JSON string in `args_json`, and "
            f"declare the intent: operation_type '{operation}', optionally data_sensitivity and a reason "
            "for the audit log."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "Tool name in server:tool form, e.g. 'github:list_repos'."},
                "args": {
                    "type": "object",
                    "additionalProperties": True,
                    "description": "The tool's arguments as an object.",
                },
                "args_json": {"type": "string", "description": "The tool's arguments as a JSON object string."},
                "intent": {
                    "type": "object",
                    "properties": {
                        "operation_type": {
                            "type": "string",
                            "enum": [operation],
                            "description": f"Must be '{operation}' for {variant}.",
                        },
                        "data_sensitivity": {
                            "type": "string",
                            "enum": list(SENSITIVITIES),
                            "description": "Sensitivity of the data involved.",
                        },
                        "reason": {
                            "type": "string",
                            "maxLength": MAX_REASON,
                            "description": "Why the call is made, for the audit trail.",
                        },
                    },
                    "required": ["operation_type"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "intent"],
            "additionalProperties": False,
        },
        "annotations": {"title": variant.replace("_", " ").capitalize(), **_HINTS[operation]},
    }


def parse_call_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The upstream tool's arguments, from `args` (an object) or `args_json` (its JSON text)."""
    args, args_json = arguments.get("args"), arguments.get("args_json")
    if args is not None and args_json is not None:
        raise ToolInputError("Give the tool's arguments in 'args' or in 'args_json', not both")
    if args is not None:
        if not isinstance(args, dict):
            raise ToolInputError(
                f"Parameter 'args' must be an object, got {json_type(args)}; to pass JSON text use 'args_json' instead"
            )
        return args
    if args_json is None:
        return {}
    if not isinstance(args_json, str):
        raise ToolInputError(
            f"Parameter 'args_json' must be a string holding a JSON object, got {json_type(args_json)}"
        )
    if not args_json.strip():
        return {}
    decoded = decode_json(args_json, "args_json")
    if not isinstance(decoded, dict):
        raise ToolInputError(f"Parameter 'args_json' must hold a JSON object, got {json_type(decoded)}")
    return decoded


def parse_intent(variant: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The declared intent; its operation_type must be the variant's."""
    operation = VARIANTS[variant]
    intent = arguments.get("intent")
    if isinstance(intent, str):  # some clients send nested objects as JSON text
        intent = decode_json(intent, "intent")
    if intent is None:
        raise ToolInputError(
            f'Parameter \'intent\' is required, e.g. {{"operation_type": "{operation}", "reason": "..."}}'
        )
    if not isinstance(intent, dict):
        raise ToolInputError(f"Parameter 'intent' must be an object, got {json_type(intent)}")
    check_parameters(intent, _INTENT_FIELDS, what=f"{variant}'s intent")
    declared = intent.get("operation_type")
    if declared is None:
        raise ToolInputError(f"intent.operation_type is required: '{operation}' for {variant}")
    if declared != operation:
        if declared in VARIANTS.values():
            raise ToolInputError(
                f"intent.operation_type is '{declared}' but this is {variant}: "
                f"call call_tool_{declared} for a {declared} operation, or declare '{operation}'"
            )
        raise ToolInputError(f"intent.operation_type must be '{operation}' for {variant}, got {declared!r}")
    sensitivity = intent.get("data_sensitivity")
    if sensitivity is not None and sensitivity not in SENSITIVITIES:
        raise ToolInputError(f"intent.data_sensitivity must be one of {', '.join(SENSITIVITIES)}; got {sensitivity!r}")
    reason = intent.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ToolInputError(f"intent.reason must be a string, got {json_type(reason)}")
    if reason is not None and len(reason) > MAX_REASON:
        raise ToolInputError(f"intent.reason is longer than {MAX_REASON} characters")
    return {key: intent[key] for key in _INTENT_FIELDS if intent.get(key) is not None}


class ToolCaller:
    """Runs the call variants: checks, the destructive rule, one call through the door, cutting."""

    def __init__(self, upstreams: Upstreams, cache: ResponseCache) -> None:
        self.upstreams = upstreams
        self.cache = cache

    async def call(self, variant: str, arguments: Mapping[str, Any], ctx: Any = None) -> dict[str, Any]:
        check_parameters(arguments, _PARAMETERS, what=variant)
        name = get_string(arguments, "name", required=True)
        assert name is not None
        args = parse_call_arguments(arguments)
        intent = parse_intent(variant, arguments)
        target = self.upstreams.find_tool(name, quarantined=True)
        params: dict[str, Any] = {"name": target.tool, "arguments": args}
        token = ctx.progress_token if ctx is not None else None
        if token is not None:
            params["_meta"] = {"progressToken": token}
        if ctx is not None:
            params.update(ctx.carried)  # the answers to a question the upstream asked last round
        call = ClientCall(ctx, target.server) if ctx is not None else None
        try:
            result = await self.upstreams.call_tool(
                target, params, call, via=variant, intent=intent, destructive=variant == "call_tool_destructive"
            )
        except Refused as refused:
            return refused.answer
        except UpstreamError as exc:
            return error_result(exc.message)
        if isinstance(result, dict):
            return result  # input required: the client answers and calls again
        return cut_result(decoded(result), self.upstreams.settings.tool_response_limit, self.cache)
