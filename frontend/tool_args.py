"""What every built-in tool shares: checking its arguments, and the shapes of its answers.

A built-in tool reports a problem the caller can fix (a missing field, a wrong type, an unknown
server) as a tool result with `isError`, so the model reads the message and corrects itself.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any


class ToolInputError(Exception):
    """A built-in tool cannot do what was asked; the message tells the caller what to change."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# -- answers -----------------------------------------------------------------------------------


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def text_result(*texts: str, is_error: bool = False) -> dict[str, Any]:
    """A `CallToolResult` wire dict of text blocks."""
    content = [{"type": "text", "text": text} for text in texts]
    return {"content": content, "isError": is_error, "resultType": "complete"}


def json_result(data: Mapping[str, Any]) -> dict[str, Any]:
    """A result whose text is `data` as JSON, also given as `structuredContent`."""
    result = text_result(dumps(data))
    result["structuredContent"] = dict(data)
    return result


def error_result(message: str) -> dict[str, Any]:
    return text_result(message, is_error=True)


# -- arguments ---------------------------------------------------------------------------------


def check_parameters(arguments: Mapping[str, Any], allowed: Collection[str], *, what: str) -> None:
    """Refuse parameters `what` (a tool, or a tool's operation) does not take."""
    unknown = [key for key in arguments if key not in allowed]
    if unknown:
        names = ", ".join(f"'{key}'" for key in unknown)
        accepted = ", ".join(f"'{key}'" for key in allowed)
        raise ToolInputError(f"Unknown parameter {names} for {what}. Accepted parameters: {accepted}.")


def get_string(
    arguments: Mapping[str, Any],
    key: str,
    *,
    required: bool = False,
    choices: Collection[str] | None = None,
    max_length: int | None = None,
) -> str | None:
    """A string parameter; an explicit null counts as absent."""
    value = arguments.get(key)
    if value is None:
        if required:
            raise ToolInputError(f"Parameter '{key}' is required")
        return None
    if not isinstance(value, str):
        raise ToolInputError(f"Parameter '{key}' must be a string, got {json_type(value)}")
    if required and not value.strip():
        raise ToolInputError(f"Parameter '{key}' must not be empty")
    if choices is not None and value not in choices:
        raise ToolInputError(f"Parameter '{key}' must be one of {', '.join(choices)}; got '{value}'")
    if max_length is not None and len(value) > max_length:
        raise ToolInputError(f"Parameter '{key}' is longer than {max_length} characters")
    return value


def get_integer(
    arguments: Mapping[str, Any], key: str, *, default: int, minimum: int, maximum: int | None = None
) -> int:
    """An integer parameter within bounds; JSON's 5.0 is the integer 5, true is not a number."""
    value = arguments.get(key)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ToolInputError(f"Parameter '{key}' must be an integer, got {json_type(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"of {minimum} or more"
        raise ToolInputError(f"Parameter '{key}' must be an integer {bounds}; got {value}")
    return value


def decode_json(text: str, key: str) -> Any:
    """Parse the JSON text of parameter `key`; NaN and Infinity are not JSON."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ToolInputError(f"Parameter '{key}' is not valid JSON: {exc}") from None


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")
