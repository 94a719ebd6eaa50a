"""Proposals: the store in the data dir, and the supervisor's own checks of what a client proposes.

The supervisor checks again what the frontend checked (secret references, fields a client may not
set, client_server_changes = "off"), so these tests send `server.propose` and `server.patch`
straight to a real Supervisor, as a frontend with a bug would.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import trio

from mcpvisor.store.proposals import FILE_NAME, ProposalStore, new_proposal, secret_references
from mcpvisor.supervisor.commands import CommandError
from mcpvisor.supervisor.config import load
from mcpvisor.supervisor.supervisor import Supervisor

ECHO = {"command": sys.executable, "args": ["-c", "pass"]}


def test_secret_references_are_found_anywhere_and_named_by_path_not_value() -> None:
    table = {
        "command": "sh",
        "args": ["-c", "cat ${file:/etc/shadow}"],
        "env": {"OK": "plain", "T": "${env:TOKEN}", "${env:KEY}": "x"},
        "headers": {"X": "Bearer ${ENV:TOKEN}"},
        "url": "http://h/?k=${ env:TOKEN}",
        "cwd": "/tmp",
    }
    found = secret_references(table)
    assert found == ["args[1]", "env.T", "env.<key>", "headers.X", "url"]
    assert not any("shadow" in path or "TOKEN" in path for path in found)
    assert secret_references({"command": "sh", "env": {"A": "$HOME", "B": "{env:X}"}}) == []


def test_the_store_keeps_one_proposal_per_name_privately_across_loads(tmp_path: Path) -> None:
    store = ProposalStore.load(tmp_path)
    assert list(store) == []
    assert store.put(new_proposal("a", "add", config=ECHO)) is None
    replaced = store.put(new_proposal("a", "remove"))
    assert replaced is not None and replaced.action == "add"
    store.put(new_proposal("b", "disable"))
    path = tmp_path / FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = ProposalStore.load(tmp_path)
    assert [(p.name, p.action) for p in again] == [("a", "remove"), ("b", "disable")]
    # An add for a name now configured, and a change to a server gone, are stale.
    again.put(new_proposal("c", "add", config=ECHO))
    dropped = again.prune(["c", "b"])
    assert sorted((p.name, p.action) for p in dropped) == [("a", "remove"), ("c", "add")]
    assert [p.name for p in ProposalStore.load(tmp_path)] == ["b"]


def test_an_unreadable_store_is_set_aside_and_a_half_written_one_removed(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text("{not json")
    (tmp_path / f".{FILE_NAME}.tmp").write_text("half")
    store = ProposalStore.load(tmp_path)
    assert list(store) == []
    assert (tmp_path / f"{FILE_NAME}.unreadable").read_text() == "{not json"
    assert not (tmp_path / f".{FILE_NAME}.tmp").exists()


def supervisor(tmp_path: Path, **settings: Any) -> Supervisor:
    path = tmp_path / "mcpvisor.toml"
    settings = {"data_dir": str(tmp_path / "data"), **settings}
    (tmp_path / "data").mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps({"mcpvisor": settings, "servers": {"alpha": ECHO}}))
    return Supervisor(load(path), path)


def run(sup: Supervisor, name: str, data: dict[str, Any]) -> Any:
    spec = sup.commands[name]
    return trio.run(spec.handler, sup, spec.parse([], data))


def refusal(sup: Supervisor, name: str, data: dict[str, Any]) -> str:
    with pytest.raises(CommandError) as caught:
        run(sup, name, data)
    return caught.value.message


@pytest.mark.parametrize(
    "data",
    [
        {"name": "x", "action": "add", "config": {"command": "sh", "env": {"T": "${env:HOME}"}}},
        {
            "name": "x",
            "action": "add",
            "config": {"url": "http://127.0.0.1:9/", "headers": {"X": "${file:/etc/passwd}"}},
        },
        {"name": "alpha", "action": "patch", "patch": {"args": ["${file:/etc/passwd}"]}},
        {"name": "alpha", "action": "patch", "patch": {"cwd": "${env:HOME}"}},
    ],
)
def test_the_supervisor_refuses_secret_references_the_frontend_let_through(
    tmp_path: Path, data: dict[str, Any]
) -> None:
    sup = supervisor(tmp_path)
    message = refusal(sup, "server.propose", data)
    assert "not accepted from an MCP client" in message and "/etc/passwd" not in message
    assert list(sup.proposals) == []


def test_the_supervisor_refuses_what_a_client_may_not_set_and_what_is_off(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    table = {**ECHO, "quarantined": False}
    assert "may not set 'quarantined'" in refusal(
        sup, "server.propose", {"name": "x", "action": "add", "config": table}
    )
    assert "cannot be changed directly" in refusal(sup, "server.patch", {"name": "alpha", "patch": {"command": "sh"}})
    assert "already exists" in refusal(sup, "server.propose", {"name": "alpha", "action": "add", "config": ECHO})
    assert "no such server" in refusal(sup, "server.propose", {"name": "ghost", "action": "remove"})
    assert list(sup.proposals) == []

    off = supervisor(tmp_path / "off", client_server_changes="off")
    for command, data in [
        ("server.propose", {"name": "x", "action": "add", "config": ECHO}),
        ("server.propose", {"name": "alpha", "action": "disable"}),
        ("server.patch", {"name": "alpha", "patch": {"policy": {"call_timeout": 5}}}),
    ]:
        assert 'client_server_changes = "off"' in refusal(off, command, data)


def test_proposals_are_kept_not_applied_and_a_no_op_is_not_kept(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    config_before = sup.config_path.read_text()
    answer = run(sup, "server.propose", {"name": "alpha", "action": "patch", "patch": {"env": {"A": "1"}}})
    assert answer["pending"] is True and answer["proposal"]["fields"] == ["env"]
    assert run(sup, "server.propose", {"name": "alpha", "action": "enable"})["pending"] is False
    assert [p.action for p in sup.proposals] == ["patch"], "a no-op leaves the earlier proposal alone"
    run(sup, "server.propose", {"name": "alpha", "action": "disable"})
    run(sup, "server.propose", {"name": "alpha", "action": "enable"})
    assert list(sup.proposals) == [], "asking for what already is withdraws the opposite proposal"
    run(sup, "server.propose", {"name": "new", "action": "add", "config": {"url": "https://u:pw@h.example/mcp"}})
    listed = run(sup, "server.proposals", {})["proposals"]
    assert [(row["name"], row["action"], row["transport"], row["url"]) for row in listed] == [
        ("new", "add", "streamable-http", "https://u:***@h.example/mcp")
    ]
    assert sup.config_path.read_text() == config_before
    assert "alpha" in sup.config.servers and "new" not in sup.config.servers
    saved = json.loads((tmp_path / "data" / FILE_NAME).read_text())
    assert [p["name"] for p in saved["proposals"]] == ["new"]
