"""The config file described from its own Structs: the JSON Schema editors read, and the reference page.

Both are generated from the Structs `load` decodes into (supervisor/config.py), with the
descriptions their fields carry, so neither can say something the loader does not do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from inspect import cleandoc
from typing import Any

import msgspec
import msgspec.inspect as mi

from mcpvisor.supervisor.config import Config

# What a key of a dict-of-tables stands for in a table's name: `[servers.NAME]`, `[registries.ID]`.
_KEY_WORD = {"registries": "ID"}


def schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of the config file; an unknown key is refused (`additionalProperties: false`)."""
    generated = msgspec.json.schema(Config)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "mcpvisor configuration",
        **generated,
    }


def schema_json() -> str:
    return json.dumps(schema(), indent=2, sort_keys=False) + "\n"


@dataclass(frozen=True)
class Key:
    """One key of a table, as the reference shows it."""

    name: str
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Table:
    """One TOML table (`[servers.NAME.policy]`), its docstring and its keys."""

    path: str
    doc: str
    keys: list[Key]
    array: bool = False  # an array of tables: `[[path]]`

    @property
    def heading(self) -> str:
        return f"[[{self.path}]]" if self.array else f"[{self.path}]"


def tables() -> list[Table]:
    """Every table of the file, in the order of the Structs (the order a file is written in)."""
    return list(_walk(mi.type_info(Config), []))


def _walk(struct: mi.StructType, path: list[str], array: bool = False) -> Iterator[Table]:
    keys: list[Key] = []
    nested: list[tuple[mi.StructType, list[str], bool]] = []
    for field in struct.fields:
        inner, description = _unwrap(field.type)
        table = _table_of(inner)
        if table is not None:
            sub, per_key = table
            key_word = [_KEY_WORD.get(field.encode_name, "NAME")] if per_key else []
            nested.append((sub, [*path, field.encode_name, *key_word], False))
            if not _also_a_value(inner):
                continue
        elif isinstance(inner, mi.ListType) and isinstance(item := _unwrap(inner.item_type)[0], mi.StructType):
            nested.append((item, [*path, field.encode_name], True))  # `[[path.key]]`, listed as a key too
        keys.append(Key(field.encode_name, _type_name(inner), _default(field), description))
    if path:
        yield Table(".".join(path), _doc(struct.cls), keys, array)
    for sub, sub_path, sub_array in nested:
        yield from _walk(sub, sub_path, sub_array)


def missing_descriptions() -> list[str]:
    """Keys and tables that carry no description: each must have one for the reference to be whole."""
    missing: list[str] = []

    def visit(struct: mi.StructType, path: list[str]) -> None:
        if not _doc(struct.cls):
            missing.append(f"{'.'.join(path) or 'the file'}: the Struct {struct.cls.__name__} has no docstring")
        for field in struct.fields:
            inner, description = _unwrap(field.type)
            if not description.strip():
                missing.append(".".join([*path, field.encode_name]))
            if (table := _table_of(inner)) is not None:
                visit(table[0], [*path, field.encode_name])
            elif isinstance(inner, mi.ListType) and isinstance(item := _unwrap(inner.item_type)[0], mi.StructType):
                visit(item, [*path, field.encode_name])

    visit(mi.type_info(Config), [])
    return missing


def _unwrap(info: mi.Type) -> tuple[mi.Type, str]:
    """The type under any `Annotated[...]`, and the description it carries."""
    description = ""
    while isinstance(info, mi.Metadata):
        description = (info.extra_json_schema or {}).get("description", description)
        info = info.type
    return info, description


def _table_of(info: mi.Type) -> tuple[mi.StructType, bool] | None:
    """A Struct (or optional Struct) is a table; a dict of Structs is a table per key (True).

    A union of one Struct and plain values (`sandbox = true` or a `[...sandbox]` table) is a table
    too, and also a key (`_also_a_value`).
    """
    if isinstance(info, mi.UnionType):
        members = [_unwrap(t)[0] for t in info.types if not isinstance(t, mi.NoneType)]
        structs = [t for t in members if isinstance(t, mi.StructType)]
        if len(members) == 1 or len(structs) == 1:
            info = structs[0] if structs else members[0]
    if isinstance(info, mi.StructType):
        return info, False
    if isinstance(info, mi.DictType):
        value = _unwrap(info.value_type)[0]
        if isinstance(value, mi.StructType):
            return value, True
    return None


def _also_a_value(info: mi.Type) -> bool:
    """A key that takes a plain value as well as a table."""
    if not isinstance(info, mi.UnionType):
        return False
    return any(not isinstance(_unwrap(t)[0], mi.StructType | mi.NoneType) for t in info.types)


def _type_name(info: mi.Type) -> str:
    info = _unwrap(info)[0]
    match info:
        case mi.BoolType():
            return "boolean"
        case mi.StrType():
            return "string"
        case mi.IntType() | mi.FloatType():
            return ("integer" if isinstance(info, mi.IntType) else "number") + _bounds(info)
        case mi.LiteralType():
            return " or ".join(_toml(value) for value in info.values)
        case mi.ListType() | mi.VarTupleType():
            return f"array of {_plural(_type_name(info.item_type))}"
        case mi.DictType():
            return f"table of {_plural(_type_name(info.value_type))}"
        case mi.UnionType():
            return " or ".join(_type_name(t) for t in info.types if not isinstance(t, mi.NoneType))
        case mi.StructType():
            return "table"
    return type(info).__name__.removesuffix("Type").lower()


def _plural(name: str) -> str:
    return {"string": "strings", "integer": "integers", "number": "numbers", "boolean": "booleans"}.get(name, name)


def _bounds(info: mi.IntType | mi.FloatType) -> str:
    parts = [
        f"{sign} {_toml(value)}"
        for sign, value in ((">", info.gt), ("≥", info.ge), ("<", info.lt), ("≤", info.le))
        if value is not None
    ]
    return f" ({', '.join(parts)})" if parts else ""


def _default(field: mi.Field) -> str:
    if field.required:
        return "required"
    value = field.default_factory() if field.default_factory is not msgspec.NODEFAULT else field.default
    return "unset" if value is None else _toml(value)


def _toml(value: Any) -> str:
    """A value as it is written in the file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + "}"
    return str(value)


def _doc(cls: type) -> str:
    return cleandoc(cls.__doc__ or "")


def _cell(text: str) -> str:
    """Text that stays in one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def markdown() -> str:
    """docs/configuration.md: every table and key, its type, default and meaning."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from the config Structs by `mcpvisor config docs`; edit their descriptions, not this page. -->",
        "",
        _doc(Config),
        "",
        "Secret references, `${env:NAME}` and `${file:PATH}`, are allowed where a key says so; they are",
        "resolved in the worker that needs them and never shown. Durations are in seconds unless a key's",
        "name says otherwise. A key that is not set takes the default shown.",
        "",
        "## Editor support",
        "",
        "`mcpvisor config schema` prints the JSON Schema of this file, generated from the same Structs,",
        "so it accepts what `mcpvisor check` accepts and refuses an unknown key. Editors that read",
        "TOML with [Taplo](https://taplo.tamasfe.dev) (VS Code's Even Better TOML, Helix, Zed, Neovim's",
        "taplo language server) pick it up from a `#:schema` line at the top of the file:",
        "",
        "```sh",
        "mcpvisor config schema > mcpvisor.schema.json",
        "```",
        "",
        "```toml",
        "#:schema ./mcpvisor.schema.json",
        "[mcpvisor]",
        'listen = "127.0.0.1:8080"',
        "```",
        "",
        "The example configs in [deploy/examples](../deploy/examples) point at the copy kept in this",
        "folder, [mcpvisor.schema.json](mcpvisor.schema.json).",
        "",
        "## Tables",
        "",
    ]
    found = tables()
    lines += [f"- [`{table.heading}`](#{_anchor(table.heading)})" for table in found]
    for table in found:
        lines += ["", f"## {table.heading}", "", _without_name(table.doc, table.heading), ""]
        if not table.keys:
            continue
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        lines += [
            f"| `{key.name}` | {_cell(key.type)} | `{_cell(key.default)}` | {_cell(key.description)} |"
            if key.default not in ("required", "unset")
            else f"| `{key.name}` | {_cell(key.type)} | {key.default} | {_cell(key.description)} |"
            for key in table.keys
        ]
    return "\n".join(lines) + "\n"


def _without_name(doc: str, heading: str) -> str:
    """A Struct's docstring under its own heading: without the table's name it starts with."""
    prefix = f"`{heading}`: "
    if not doc.startswith(prefix):
        return doc
    rest = doc.removeprefix(prefix)
    return rest[:1].upper() + rest[1:]


def _anchor(heading: str) -> str:
    """GitHub's anchor of the heading `## [path]` (or `## [[path]]`)."""
    return "".join(ch for ch in heading.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")
