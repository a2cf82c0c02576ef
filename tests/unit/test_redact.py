"""Passwords masked in what reorg shows (framework.redact), without a server:
URLs, DSNs, property lists, the one-line error, both log formats, and the
JDBC target Spark is given."""

from __future__ import annotations

import json
import logging

import pytest

from backfill.spark.jdbc import jdbc_target
from cli.logs import JsonFormatter, TextFormatter
from framework.db import describe_url
from framework.errors import one_line
from framework.redact import redact, redact_all

SECRET = "pw-Zq8xK3vR7"

SHOWN = {
    "URL": f"cannot reach postgresql://bob:{SECRET}@db:5432/app: refused",
    "driver URL": f"postgresql+psycopg://bob:{SECRET}@db/app",
    "password with @ and :": f"postgresql://bob:{SECRET}@x:y@db/app",
    "DSN": f"host=db password={SECRET} user=bob",
    "JDBC properties": f"{{user=bob, password={SECRET}, driver=org.postgresql.Driver}}",
    "JSON": json.dumps({"password": SECRET}),
}


@pytest.mark.parametrize("text", SHOWN.values(), ids=SHOWN.keys())
def test_passwords_are_masked(text: str) -> None:
    masked = redact(text)
    assert SECRET not in masked and "***" in masked


def test_what_has_no_password_is_left_alone() -> None:
    for text in ("postgresql://bob@db/app", "password authentication failed for user bob",
                 "https://example.com/a:b@c"):
        assert redact(text) == text


def test_one_line_masks_the_error_it_reports() -> None:
    assert SECRET not in one_line(RuntimeError(SHOWN["URL"] + "\nmore"))


def test_both_log_formats_mask_messages_and_tracebacks() -> None:
    try:
        raise RuntimeError(SHOWN["URL"])
    except RuntimeError:
        record = logging.LogRecord("reorg.worker", logging.ERROR, __file__, 1,
                                   "connecting to %s", (SHOWN["driver URL"],), exc_info=True)
        import sys

        record.exc_info = sys.exc_info()
    for formatter in (TextFormatter("%(message)s"), JsonFormatter("n1")):
        line = formatter.format(record)
        assert SECRET not in line and "***" in line


def test_describe_url_and_the_jdbc_target_show_no_password() -> None:
    assert describe_url(f"postgresql://bob:{SECRET}@db:6543/app") == "db:6543/app"
    assert describe_url(f"postgresql://bob:{SECRET}@db:notaport/app") == "db:notaport/app"
    target = jdbc_target(f"postgresql://bob:{SECRET}@db:6543/app")
    assert target.properties["password"] == SECRET  # Spark gets it ...
    assert SECRET not in repr(target) and SECRET not in target.url  # ... nothing shows it


def test_a_jobs_params_are_redacted_string_by_string():
    params = {"set": "c = 'password=hunter2'", "rows": 300, "none": None,
              "urls": ["postgresql://u:pw@h/db", {"dsn": "host=h pwd=x"}]}
    assert redact_all(params) == {
        "set": "c = 'password=***'", "rows": 300, "none": None,
        "urls": ["postgresql://u:***@h/db", {"dsn": "host=h pwd=***"}]}
