"""Secret references: resolved where they are used, never shown where they are listed or logged."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcpvisor.wire.redaction import redact_table, redact_value
from mcpvisor.wire.secrets import REDACTED, Redactor, SecretError, resolve, resolve_all

ENV = {"TOKEN": "tok-3f9a2b7c", "USER": "svc-bot"}


# -- resolving --------------------------------------------------------------------------------------


def test_an_env_reference_is_replaced_by_the_variable() -> None:
    assert resolve("Bearer ${env:TOKEN}", ENV) == "Bearer tok-3f9a2b7c"


def test_a_file_reference_is_replaced_by_the_file_without_its_trailing_newline(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("file-secret-81d2\n")
    assert resolve(f"${{file:{secret}}}", ENV) == "file-secret-81d2"


def test_a_file_reference_under_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "key").write_text("home-secret")
    assert resolve("${file:~/key}", ENV) == "home-secret"


def test_several_references_in_one_value(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("pw-77aa")
    value = f"https://${{env:USER}}:${{file:{tmp_path}/pw}}@host/?t=${{env:TOKEN}}&again=${{env:USER}}"
    assert resolve(value, ENV) == "https://svc-bot:pw-77aa@host/?t=tok-3f9a2b7c&again=svc-bot"


def test_a_value_without_references_is_unchanged() -> None:
    assert resolve("plain $HOME {env:TOKEN} $env:TOKEN", ENV) == "plain $HOME {env:TOKEN} $env:TOKEN"


def test_a_resolved_value_is_not_resolved_again() -> None:
    # A secret that happens to look like a reference must not pull in another secret.
    assert resolve("${env:A}", {"A": "${env:B}", "B": "leaked"}) == "${env:B}"


def test_resolve_uses_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCPVISOR_TEST_SECRET", "from-os-environ")
    assert resolve("${env:MCPVISOR_TEST_SECRET}") == "from-os-environ"


def test_resolve_all_resolves_every_value_and_keeps_the_keys() -> None:
    table = {"Authorization": "Bearer ${env:TOKEN}", "X-User": "${env:USER}", "Accept": "json"}
    assert resolve_all(table, ENV) == {"Authorization": "Bearer tok-3f9a2b7c", "X-User": "svc-bot", "Accept": "json"}


def test_a_missing_variable_names_the_variable_and_no_value() -> None:
    value = "literal-part-5e1c ${env:TOKEN} ${env:NOT_SET_ANYWHERE}"
    with pytest.raises(SecretError) as info:
        resolve(value, ENV)

    message = str(info.value)
    assert "NOT_SET_ANYWHERE" in message
    assert "not set" in message
    for never in ("tok-3f9a2b7c", "literal-part-5e1c", "svc-bot"):
        assert never not in message


def test_a_missing_file_names_the_path_and_no_value(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(SecretError) as info:
        resolve(f"${{env:TOKEN}}:${{file:{missing}}}", ENV)

    message = str(info.value)
    assert f"cannot read secret file {missing}" in message
    assert "No such file or directory" in message
    assert "tok-3f9a2b7c" not in message


def test_a_directory_is_not_a_readable_secret_file(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match=f"cannot read secret file {tmp_path}: Is a directory"):
        resolve(f"${{file:{tmp_path}}}", ENV)


def test_a_secret_error_hides_the_underlying_exception(tmp_path: Path) -> None:
    with pytest.raises(SecretError) as info:
        resolve(f"${{file:{tmp_path / 'nope'}}}", ENV)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__ is True


# -- redacting listings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["Authorization", "X-Api-Key", "Cookie", "Proxy-Authorization", "API_TOKEN", "DB_PASSWORD", "client_secret"],
)
def test_a_literal_value_under_a_sensitive_name_is_masked(key: str) -> None:
    assert redact_value(key, "sk-live-0123456789") == REDACTED


@pytest.mark.parametrize("key", ["Authorization", "DEBUG", "X-Api-Key"])
def test_a_reference_is_shown_as_written(key: str) -> None:
    assert redact_value(key, "Bearer ${env:TOKEN}") == "Bearer ${env:TOKEN}"
    assert redact_value(key, "${file:/run/secrets/k}") == "${file:/run/secrets/k}"


@pytest.mark.parametrize(("key", "value"), [("Accept", "application/json"), ("DEBUG", "1"), ("User-Agent", "mcpvisor")])
def test_a_harmless_value_is_kept(key: str, value: str) -> None:
    assert redact_value(key, value) == value


def test_redact_table_masks_only_literal_secrets() -> None:
    table = {
        "Authorization": "Bearer sk-literal-123",
        "X-Api-Key": "${env:API_KEY}",
        "Cookie": "session=abc",
        "Accept": "text/event-stream",
    }
    assert redact_table(table) == {
        "Authorization": REDACTED,
        "X-Api-Key": "${env:API_KEY}",
        "Cookie": REDACTED,
        "Accept": "text/event-stream",
    }
    assert table["Authorization"] == "Bearer sk-literal-123"  # the input is not changed


# -- scrubbing free text ----------------------------------------------------------------------------


def test_the_redactor_replaces_every_occurrence_of_every_secret() -> None:
    redact = Redactor(["tok-3f9a2b7c", "pw-77aa"])
    text = "401 for tok-3f9a2b7c (user:pw-77aa), retried with tok-3f9a2b7c"
    assert redact(text) == "401 for *** (user:***), retried with ***"


def test_the_longest_secret_is_replaced_first() -> None:
    # Were "abcd" replaced first, the tail "efgh" of the longer secret would be left in the text.
    redact = Redactor(["abcd", "abcdefgh"])
    assert redact("key=abcdefgh other=abcd") == "key=*** other=***"


def test_a_secret_added_later_is_also_sorted_longest_first() -> None:
    redact = Redactor(["abcd"])
    redact.add("xxabcdxx")
    assert redact("xxabcdxx") == "***"


def test_values_shorter_than_four_characters_are_ignored() -> None:
    redact = Redactor(["abc", "", "1"])
    redact.add("xyz")
    assert redact("abc 1 xyz and a b c") == "abc 1 xyz and a b c"
    redact.add("wxyz")
    assert redact("wxyz xyz") == "*** xyz"


def test_an_empty_redactor_changes_nothing() -> None:
    assert Redactor()("nothing to hide") == "nothing to hide"


@pytest.mark.parametrize(
    ("key", "value", "hidden"),
    [
        ("DATABASE_URL", "postgres://app:hunter2-very-secret@db.internal:5432/app", "hunter2-very-secret"),
        ("UPSTREAM", "https://api.example.com/v1?api_key=k3y-0123456789abcdef", "k3y-0123456789abcdef"),
        ("GITHUB", "ghp_0123456789abcdefghijABCDEFGHIJ012345", "0123456789abcdefghijABCDEFGHIJ012345"),
        ("HEADER", "Bearer ${env:TOKEN} sk-live-0123456789abcdef", "0123456789abcdef"),
    ],
)
def test_a_secret_inside_an_ordinary_value_is_masked(key: str, value: str, hidden: str) -> None:
    shown = redact_value(key, value)
    assert hidden not in shown
    assert shown != value
