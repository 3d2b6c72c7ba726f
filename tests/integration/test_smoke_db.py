"""Proves DATABASE_URL reaches a PostgreSQL server the suite can use."""

import pytest
from django.db import connection


@pytest.mark.django_db
def test_database_is_postgresql():
    assert connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("select current_setting('server_version_num')::int")
        (version,) = cursor.fetchone()
    assert version >= 130000
