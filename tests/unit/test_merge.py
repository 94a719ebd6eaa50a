"""The deep merge behind `upstream_servers patch`: the rules of seed 004's smart patching table."""

from __future__ import annotations

import copy

from mcpvisor.wire.merge import deep_merge

BASE = {
    "command": "npx",
    "args": ["-y", "some-mcp-server"],
    "env": {"TOKEN": "${env:TOKEN}", "DEBUG": "1"},
    "enabled": True,
    "policy": {"startsecs": 1.0, "call_timeout": 30.0},
}


def test_scalar_replaces_and_everything_else_is_kept() -> None:
    assert deep_merge(BASE, {"enabled": False}) == {**BASE, "enabled": False}


def test_maps_merge_new_keys_added_existing_updated() -> None:
    merged = deep_merge(BASE, {"env": {"DEBUG": "0", "REGION": "eu"}})
    assert merged["env"] == {"TOKEN": "${env:TOKEN}", "DEBUG": "0", "REGION": "eu"}


def test_arrays_replace_entirely() -> None:
    assert deep_merge(BASE, {"args": ["other"]})["args"] == ["other"]
    assert deep_merge(BASE, {"args": []})["args"] == []


def test_nested_objects_merge_only_the_fields_given() -> None:
    merged = deep_merge(BASE, {"policy": {"call_timeout": 5.0}})
    assert merged["policy"] == {"startsecs": 1.0, "call_timeout": 5.0}


def test_explicit_null_removes_a_field_at_any_depth() -> None:
    merged = deep_merge(BASE, {"policy": None, "env": {"DEBUG": None}})
    assert "policy" not in merged
    assert merged["env"] == {"TOKEN": "${env:TOKEN}"}


def test_null_for_an_absent_key_is_a_no_op() -> None:
    assert deep_merge(BASE, {"cwd": None}) == BASE


def test_map_onto_a_scalar_or_absent_key_becomes_that_map_without_its_nulls() -> None:
    merged = deep_merge({"headers": "oops"}, {"headers": {"A": "1", "B": None}, "new": {"x": {"y": None, "z": 2}}})
    assert merged == {"headers": {"A": "1"}, "new": {"x": {"z": 2}}}


def test_scalar_replaces_a_map() -> None:
    assert deep_merge(BASE, {"policy": "none"})["policy"] == "none"


def test_inputs_are_not_changed_and_the_result_shares_no_containers() -> None:
    base, patch = copy.deepcopy(BASE), {"args": ["a"], "env": {"X": "1"}}
    before_base, before_patch = copy.deepcopy(base), copy.deepcopy(patch)
    merged = deep_merge(base, patch)
    assert (base, patch) == (before_base, before_patch)
    merged["args"].append("b")
    merged["env"]["Y"] = "2"
    merged["policy"]["startsecs"] = 9.0
    assert (base, patch) == (before_base, before_patch)


def test_empty_patch_returns_an_equal_copy() -> None:
    merged = deep_merge(BASE, {})
    assert merged == BASE
    assert merged is not BASE
