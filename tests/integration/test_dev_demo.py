"""dev.py demo keeps the example shop in a database of its own, and touches no other database.

These drive dev.py's own helpers against the real server (``DATABASE_URL``), with the test
interpreter's environment standing in for the demo's virtualenv.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import environ
import psycopg
import pytest
from psycopg import sql

import dev

SERVER_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
VENV = Path(sys.prefix)  # dev.py runs the helper with this venv's python: the test's own
NAME = f"{os.environ.get('DBQUEUE_TEST_DATABASE', 'test_dbqueue')}_devdemo"


def server_connection() -> psycopg.Connection:
    cfg = environ.Env.db_url_config(SERVER_URL)
    kw = {k.lower(): str(v) for k, v in cfg.items() if k in ("HOST", "PORT", "USER", "PASSWORD")}
    kw = {k: v for k, v in kw.items() if v}
    return psycopg.connect(dbname=cfg.get("NAME") or "postgres", autocommit=True, **kw)


def database_comment(name: str) -> str | bool | None:
    """The database's comment; False when it does not exist."""
    with server_connection() as conn:
        row = conn.execute(
            "select shobj_description(oid, 'pg_database') from pg_database where datname = %s",
            [name],
        ).fetchone()
    return False if row is None else row[0]


@pytest.fixture
def demo_name():
    with server_connection() as conn:
        conn.execute(
            sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(NAME))
        )
    yield NAME
    with server_connection() as conn:
        conn.execute(
            sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(NAME))
        )


def test_creates_marks_reuses_and_drops_its_own_database(demo_name):
    assert dev.demo_database(VENV, SERVER_URL, "create", demo_name) == "created"
    assert database_comment(demo_name) == dev.DEMO_MARKER
    assert dev.demo_database(VENV, SERVER_URL, "create", demo_name) == "reused"

    demo_url = dev.with_database(SERVER_URL, demo_name)
    assert environ.Env.db_url_config(demo_url)["NAME"] == demo_name

    assert dev.demo_database(VENV, SERVER_URL, "drop", demo_name) == "dropped"
    assert database_comment(demo_name) is False
    assert dev.demo_database(VENV, SERVER_URL, "drop", demo_name) == "absent"


def test_leaves_a_database_it_did_not_create_alone(demo_name):
    with server_connection() as conn:
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(demo_name)))
    for action in ("create", "drop"):
        with pytest.raises(SystemExit) as exc:
            dev.demo_database(VENV, SERVER_URL, action, demo_name)
        assert f"a database called {demo_name} exists and was not made by dev.py demo" in str(
            exc.value
        )
    assert database_comment(demo_name) is None  # still there, unmarked


def test_connects_elsewhere_when_the_url_names_the_demo_database(demo_name):
    """A DATABASE_URL that already names the demo's database still lets dev.py drop it."""
    own_url = dev.with_database(SERVER_URL, demo_name)
    assert dev.demo_database(VENV, own_url, "create", demo_name) == "created"
    assert dev.demo_database(VENV, own_url, "drop", demo_name) == "dropped"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://postgres@127.0.0.1:5432/postgres", "postgres://postgres@127.0.0.1:5432/x"),
        ("postgres://postgres@127.0.0.1:5432", "postgres://postgres@127.0.0.1:5432/x"),
        (
            "postgres://postgres@/%2Fvar%2Frun%2Fpostgresql/postgres",
            "postgres://postgres@/%2Fvar%2Frun%2Fpostgresql/x",
        ),
        ("postgres://u:p@h:5433/db?sslmode=require", "postgres://u:p@h:5433/x?sslmode=require"),
    ],
)
def test_with_database_replaces_only_the_database_name(url, expected):
    assert dev.with_database(url, "x") == expected
