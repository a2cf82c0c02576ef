"""Passwords out of anything reorg shows: logs, events, errors, status.

A database URL may carry a password (``postgresql://user:PASSWORD@host/db``);
so may a libpq connection string (``password=...``) or a JDBC property list.
Whatever text leaves the process through an error line, a log record or a
job's stored error passes ``redact`` first, so a driver or library that
quotes its URL cannot leak the password through reorg.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
# scheme://user:password@  (the password: anything up to the last '@' before
# the host part, since an unencoded password may itself hold '@' or ':').
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@]*:)[^\s/]*(?=@)")
# password=secret, password: 'secret', "password": "secret" (DSNs, JDBC properties, JSON).
_KEY_PASSWORD = re.compile(
    r"""(?P<head>\b(?:password|passwd|pwd)["']?\s*[=:]\s*["']?)[^\s"',;&}]+""", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every password of a URL, DSN or property list masked."""
    if not text:
        return text
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    return _KEY_PASSWORD.sub(lambda m: m.group("head") + MASK, text)


def redact_all(value: Any) -> Any:
    """``value`` (JSON-like: a job's params) with every string in it redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_all(v) for v in value]
    return value
