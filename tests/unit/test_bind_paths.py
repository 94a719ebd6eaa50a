"""Binds resolved without following what a sandbox can write (runtime.pathfd), on real dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcpvisor.runtime import pathfd


def layout(tmp_path: Path) -> tuple[Path, list]:
    teams = tmp_path / "srv" / "teams"
    (teams / "alice" / "cfg" / "cache").mkdir(parents=True)
    (teams / "bob" / "secret").mkdir(parents=True)
    places = pathfd.compile_places([f"{teams}/{{tenant}}", str(tmp_path / "data" / "sandboxes")])
    return teams, places


def test_a_real_dir_in_a_writable_place_is_opened_as_it_is(tmp_path: Path) -> None:
    teams, places = layout(tmp_path)
    fd, real = pathfd.open_path(str(teams / "alice" / "cfg" / "cache"), places)
    try:
        assert real == str(teams / "alice" / "cfg" / "cache")
        assert os.path.samestat(os.fstat(fd), os.stat(real))
    finally:
        os.close(fd)


def test_a_symlink_the_tenant_planted_is_refused_not_followed(tmp_path: Path) -> None:
    teams, places = layout(tmp_path)
    # Alice swaps `cfg` for a dir holding a relative link to her team's parent, as the attack did.
    (teams / "alice" / "cfg").rename(teams / "alice" / "cfg.old")
    (teams / "alice" / "cfg").mkdir()
    (teams / "alice" / "cfg" / "cache").symlink_to("../..")
    with pytest.raises(pathfd.Refused, match=r"symlink below .*alice, which a sandbox can write"):
        pathfd.open_path(str(teams / "alice" / "cfg" / "cache"), places)
    # An absolute one too, and one at the top of her place.
    (teams / "alice" / "cfg" / "abs").symlink_to(teams / "bob")
    with pytest.raises(pathfd.Refused):
        pathfd.open_path(str(teams / "alice" / "cfg" / "abs" / "secret"), places)


def test_the_operators_own_symlinks_are_followed_and_where_they_lead_is_writable_too(tmp_path: Path) -> None:
    teams, places = layout(tmp_path)
    (tmp_path / "link").symlink_to(teams / "alice")
    fd, real = pathfd.open_path(str(tmp_path / "link" / "cfg"), places)
    os.close(fd)
    assert real == str(teams / "alice" / "cfg")
    # /srv/teams/carol -> /elsewhere/carol: below it, carol's links are not followed either.
    (tmp_path / "elsewhere" / "carol").mkdir(parents=True)
    (teams / "carol").symlink_to(tmp_path / "elsewhere" / "carol")
    (tmp_path / "elsewhere" / "carol" / "evil").symlink_to("/etc")
    with pytest.raises(pathfd.Refused):
        pathfd.open_path(str(teams / "carol" / "evil"), places)


def test_a_bind_inside_a_writable_bind_or_place_is_refused_and_inside_a_read_only_one_allowed() -> None:
    places = pathfd.compile_places(["/srv/teams/{tenant}"])
    mounted = [("/srv/teams/alice", True), ("/srv/shared", False), ("/srv/teams", False)]
    assert "inside the writable bind" in (pathfd.nesting_refused("/srv/teams/alice/cfg/cache", mounted, places) or "")
    assert pathfd.nesting_refused("/srv/shared/scratch", mounted, places) is None
    # In the read-only bind of /srv/teams, but below alice's dir, which her other sandboxes write.
    refused = pathfd.nesting_refused("/srv/teams/alice/x", [("/srv/teams", False)], places)
    assert refused is not None and "which a sandbox can write" in refused
    assert pathfd.nesting_refused("/opt/tool", mounted, places) is None  # bwrap makes its parents itself
