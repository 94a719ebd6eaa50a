"""Task handles: which upstream made each, bounded; the opt-in and the handle forms (no processes)."""

from __future__ import annotations

from mcpvisor.frontend.door.tasks import (
    CAPABILITIES_KEY,
    TASKS,
    TaskRoutes,
    created_task,
    declares_tasks,
    exposed_task_id,
    offers_tasks,
    request_opts_in,
    split_task_id,
    with_opt_in,
)


def test_a_handle_is_known_only_for_the_server_that_made_it() -> None:
    routes = TaskRoutes()
    routes.made("jobs", "task-1")
    assert routes.knows("jobs", "task-1")
    assert not routes.knows("other", "task-1")
    assert not routes.knows("jobs", "task-2")


def test_the_oldest_handles_are_forgotten_first_and_a_reused_one_is_kept() -> None:
    routes = TaskRoutes(limit=3)
    for n in range(3):
        routes.made("jobs", f"task-{n}")
    routes.made("jobs", "task-0")  # seen again: now the newest
    routes.made("jobs", "task-3")
    assert len(routes) == 3
    assert not routes.knows("jobs", "task-1")
    assert all(routes.knows("jobs", f"task-{n}") for n in (0, 2, 3))


def test_a_removed_servers_handles_are_forgotten() -> None:
    routes = TaskRoutes()
    routes.made("jobs", "a")
    routes.made("other", "a")
    routes.forget_server("jobs")
    assert not routes.knows("jobs", "a") and routes.knows("other", "a")


def test_an_aggregating_endpoints_handle_names_its_server() -> None:
    handle = exposed_task_id("jobs", "t:1")
    assert handle == "jobs:t:1"
    assert split_task_id(handle) == ("jobs", "t:1")  # the upstream's id may hold a colon itself
    assert split_task_id("task-1") is None
    assert split_task_id(":task-1") is None and split_task_id("jobs:") is None


def test_the_opt_in_is_read_from_the_request_and_passed_on_with_the_callers_meta() -> None:
    opted = {"_meta": {CAPABILITIES_KEY: {"extensions": {TASKS: {}}}}}
    assert request_opts_in(opted)
    assert not request_opts_in({"_meta": {CAPABILITIES_KEY: {"extensions": {"other/ext": {}}}}})
    assert not request_opts_in({"_meta": {CAPABILITIES_KEY: "nonsense"}}) and not request_opts_in(None)
    assert declares_tasks({"extensions": {TASKS: {}}}) and not declares_tasks({"extensions": [TASKS]})

    forwarded = with_opt_in({"name": "slow", "_meta": {"progressToken": 7}})
    assert forwarded["_meta"]["progressToken"] == 7
    assert request_opts_in(forwarded)


def test_an_upstream_offers_tasks_under_extensions_and_a_task_result_is_recognised() -> None:
    assert offers_tasks({"capabilities": {"extensions": {TASKS: {}}}})
    assert not offers_tasks({"capabilities": {"tasks": {}}})  # the 2025-11-25 form is not carried
    assert not offers_tasks({})
    assert created_task({"resultType": "task", "taskId": "t1", "status": "working"}) == "t1"
    assert created_task({"resultType": "complete", "content": []}) is None
    assert created_task({"resultType": "task", "taskId": 5}) is None
