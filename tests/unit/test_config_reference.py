"""The config file's JSON Schema and reference page: whole, current, and in agreement with the loader.

Given the Structs the loader decodes into, every key carries a description, the generated page
and schema in docs/ are the ones the Structs give today, every example config the project ships
is accepted by the schema and by `mcpvisor check`, and a misspelt key is refused by both.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest

from mcpvisor.supervisor import config as config_mod
from mcpvisor.supervisor import config_reference
from mcpvisor.wire.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
SCHEMA_FILE = ROOT / "docs" / "mcpvisor.schema.json"
REGENERATE = (
    "regenerate it: .venv/bin/mcpvisor config docs > docs/configuration.md"
    " && .venv/bin/mcpvisor config schema > docs/mcpvisor.schema.json"
)


def example_configs() -> list[tuple[str, str]]:
    """(name, TOML text) of every config the project ships: deploy/examples and the Kubernetes ConfigMap."""
    found = [(str(path.relative_to(ROOT)), path.read_text()) for path in sorted((ROOT / "deploy").rglob("*.toml"))]
    for manifest in sorted((ROOT / "deploy").rglob("*.yaml")):
        # A ConfigMap's `mcpvisor.toml: |` block: the lines indented deeper than its key.
        lines = manifest.read_text().splitlines()
        for number, line in enumerate(lines):
            if m := re.match(r"^(\s*)mcpvisor\.toml: \|\s*$", line):
                indent, block = len(m.group(1)), []
                for inner in lines[number + 1 :]:
                    if inner.strip() and len(inner) - len(inner.lstrip()) <= indent:
                        break
                    block.append(inner)
                found.append((f"{manifest.relative_to(ROOT)}:{number + 1}", "\n".join(block)))
    return found


EXAMPLES = example_configs()


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = config_reference.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_key_and_table_is_described() -> None:
    missing = config_reference.missing_descriptions()
    assert not missing, (
        "config keys without a description (write them as "
        '`name: Annotated[T, msgspec.Meta(description="...")] = default`): ' + ", ".join(missing)
    )


def test_the_reference_page_is_current() -> None:
    assert PAGE.read_text() == config_reference.markdown(), f"docs/configuration.md is stale; {REGENERATE}"


def test_the_schema_file_is_current() -> None:
    assert SCHEMA_FILE.read_text() == config_reference.schema_json(), (
        f"docs/mcpvisor.schema.json is stale; {REGENERATE}"
    )


def test_the_page_lists_every_key_with_its_default() -> None:
    page = PAGE.read_text()
    for table in config_reference.tables():
        assert f"## {table.heading}" in page
        for key in table.keys:
            row = next((line for line in page.splitlines() if line.startswith(f"| `{key.name}` |")), None)
            assert row is not None, f"[{table.path}] {key.name} is not in the page"
    # Spot checks against the Structs' own defaults, as a reader would look them up.
    assert '| `listen` | string | `"127.0.0.1:8080"` |' in page
    assert "| `startretries` | integer (≥ 0) | `5` |" in page
    assert "| `issuer` | string | required |" in page
    # A key that takes `true` or a table (`sandbox`) is listed as a key and its table as a section.
    assert "| `sandbox` | boolean or table |" in page and "## [servers.NAME.sandbox]" in page
    # An array of tables is listed as a key of its table and as a section of its own.
    assert "| `limits` | array of table |" in page and "## [[policy.limits]]" in page


def test_mcpvisor_config_schema_prints_the_schema() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mcpvisor.supervisor.cli", "config", "schema"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json.loads(config_reference.schema_json())
    assert printed["$defs"]["ServerConfig"]["additionalProperties"] is False


def test_examples_are_shipped() -> None:
    names = [name for name, _ in EXAMPLES]
    assert "deploy/examples/workstation.toml" in names
    assert any(name.startswith("deploy/kubernetes/") for name in names)


@pytest.mark.parametrize(("name", "text"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_every_example_config_is_valid(name: str, text: str, validator: jsonschema.Draft202012Validator) -> None:
    errors = [error.message for error in validator.iter_errors(tomllib.loads(text))]
    assert errors == [], f"{name}: {errors}"
    config_mod.loads(text, source=name)  # and `mcpvisor check` agrees


@pytest.mark.parametrize("path", sorted((ROOT / "deploy" / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_example_configs_name_the_schema_for_editors(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("#:schema "), f"{path.name}: the first line should be `#:schema PATH`"
    assert (path.parent / first.removeprefix("#:schema ").strip()).resolve() == SCHEMA_FILE


TYPOS = [
    ("[mcpvisor]\nlisten_on = '127.0.0.1:8080'\n", "mcpvisor.listen_on"),
    ("[servers.time]\ncomand = 'mcp-server-time'\n", "servers.time.comand"),
    ("[servers.time]\ncommand = 'mcp-server-time'\n[servers.time.policy]\nstartsec = 1\n", "startsec"),
    ("[servers.time]\ncommand = 'x'\n[tenants.a]\nserver = ['time']\n", "tenants.a.server"),
    ("[oauth]\nissuer = 'https://id.example'\nresource = 'https://mcp.example/mcp'\nclaims = 'groups'\n", "claims"),
    ("[mcpvsior]\nlisten = '127.0.0.1:8080'\n", "mcpvsior"),
]


@pytest.mark.parametrize(("text", "key"), TYPOS, ids=[key for _, key in TYPOS])
def test_a_typo_is_refused_by_the_schema_and_by_check(
    text: str, key: str, validator: jsonschema.Draft202012Validator
) -> None:
    errors = list(validator.iter_errors(tomllib.loads(text)))
    assert errors, f"the schema accepted a misspelt key {key}"
    assert any(key.rsplit(".", 1)[-1] in error.message for error in errors), [e.message for e in errors]
    with pytest.raises(ConfigError, match=re.escape(key.rsplit(".", 1)[-1])):
        config_mod.loads(text)


def test_a_wrong_type_or_value_is_refused_by_both(validator: jsonschema.Draft202012Validator) -> None:
    for text in (
        "[mcpvisor]\ntools_limit = 500\n",
        "[mcpvisor]\nlog_level = 'loud'\n",
        "[servers.time]\ncommand = 'x'\n[servers.time.policy]\nstartretries = -1\n",
        "[servers.time]\ncommand = ['x']\n",
    ):
        assert list(validator.iter_errors(tomllib.loads(text))), text
        with pytest.raises(ConfigError):
            config_mod.loads(text)


def doc_examples() -> list[tuple[str, str]]:
    """(page:line, TOML) of every ```toml block in the README and docs/: examples readers copy."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]:
        text = page.read_text()
        for m in re.finditer(r"^```toml\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
            found.append((f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1)))
    return found


DOC_EXAMPLES = doc_examples()


@pytest.mark.parametrize(("where", "text"), DOC_EXAMPLES, ids=[where for where, _ in DOC_EXAMPLES])
def test_every_toml_example_in_the_docs_fits_the_schema(
    where: str, text: str, validator: jsonschema.Draft202012Validator
) -> None:
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(tomllib.loads(text))]
    assert errors == [], f"{where}: {errors}"
