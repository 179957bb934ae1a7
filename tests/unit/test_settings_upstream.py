"""Upstream mode's settings: what a bad `UPSTREAM_URLS` error shows of the URLs it holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sluicegate.cli import main
from sluicegate.settings import Settings, describe_error, redact_url


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no stray .env
    for name in list(__import__("os").environ):
        if name.startswith("SLUICEGATE_"):
            monkeypatch.delenv(name)


def test_a_bad_upstream_url_is_named_without_its_credentials(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = "http://admin:hunter2@10.0.0.1:8000/api,http://10.0.0.2:8000/v1?token=s3cret"
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_URLS", urls)
    with pytest.raises(ValidationError) as caught:
        Settings()
    message = describe_error(caught.value)
    assert "SLUICEGATE_UPSTREAM_URLS" in message and "10.0.0.1:8000/api" in message
    for secret in ("admin", "hunter2", "s3cret"):
        assert secret not in message
    with pytest.raises(SystemExit):
        main(["serve"])
    printed = capsys.readouterr()
    assert "10.0.0.1:8000/api" in printed.err
    assert "hunter2" not in printed.err + printed.out and "s3cret" not in printed.err


def test_redacted_urls_keep_where_they_point_and_nothing_that_may_be_secret() -> None:
    assert redact_url("http://u:p@h:8000/v1") == "http://***@h:8000/v1"
    assert redact_url("u:p@h/v1") == "***@h/v1"  # no scheme: still a user and password
    assert redact_url("http://u:pa/ss@h/v1?x=1#y") == "http://***@h/v1?***"
    assert redact_url("https://h/v1#token") == "https://h/v1?***"
    assert redact_url(" http://h:8000/v1 ") == "http://h:8000/v1"


def test_a_reasoning_parser_for_upstream_urls_needs_their_tokenizer() -> None:
    from pydantic import ValidationError

    from sluicegate.settings import Settings

    with pytest.raises(ValidationError, match="needs SLUICEGATE_TOKENIZER"):
        Settings(  # type: ignore[call-arg]
            _env_file=None, upstream_urls="http://10.0.0.1:8000/v1", reasoning_parser="qwen3"
        )
    Settings(  # type: ignore[call-arg]
        _env_file=None,
        upstream_urls="http://10.0.0.1:8000/v1",
        reasoning_parser="qwen3",
        tokenizer="/models/q",
    )
