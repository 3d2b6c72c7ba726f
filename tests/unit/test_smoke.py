"""Proves the test runner, the settings and the package import work together."""

from django.apps import apps


def test_package_imports():
    import django_dbqueue

    assert django_dbqueue.__name__ == "django_dbqueue"


def test_app_is_installed():
    assert apps.is_installed("django_dbqueue")
