"""@job registration errors: duplicates name both places, wrong signatures and options."""

import pytest

from django_dbqueue import JobRegistrationError, job, registry


@pytest.fixture
def cleanup():
    names = []
    yield names
    for name in names:
        registry.unregister(name)


def test_duplicate_type_names_both_places(cleanup):
    cleanup.append("dup")

    @job("dup")
    def first(ctx):
        pass

    with pytest.raises(JobRegistrationError) as info:

        @job("dup")
        def second(ctx):
            pass

    message = str(info.value)
    assert "registered twice" in message
    assert "<locals>.first" in message and "<locals>.second" in message
    assert message.count("test_registry.py:") == 2


@pytest.mark.parametrize(
    "func",
    [
        lambda: None,
        lambda ctx, other: None,
        lambda ctx, *, required: None,
    ],
)
def test_wrong_signature_is_refused_naming_the_handler(func, cleanup):
    with pytest.raises(JobRegistrationError, match=r"takes exactly one positional argument"):
        job("bad-sig")(func)
    assert registry.get("bad-sig") is None


def test_accepted_signatures(cleanup):
    cleanup.extend(["ok-1", "ok-2", "ok-3"])
    job("ok-1")(lambda ctx: None)
    job("ok-2")(lambda ctx, extra=1: None)
    job("ok-3")(lambda *args: None)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to 2147483647"),
        (
            {"lease": -1},
            "lease must be a number of seconds greater than 0 and at most 86400, got -1",
        ),
        ({"timeout": "5"}, "timeout must be a number of seconds, got '5'"),
        ({"priority": 500}, "priority must be an integer from -100 to 100"),
        ({"backoff": 5}, "backoff must be callable"),
        ({"queue": ""}, "queue must be a non-empty string"),
    ],
)
def test_bad_options(kwargs, fragment):
    with pytest.raises(JobRegistrationError, match=fragment):
        job("bad-options", **kwargs)


def test_async_handlers_are_recognised(cleanup):
    cleanup.append("async-one")

    @job("async-one")
    async def handler(ctx):
        return 1

    assert registry.get("async-one").is_async


def test_jobs_modules_are_discovered():
    assert registry.get("record") is not None  # tests/testapp/jobs.py, found by AppConfig.ready


@pytest.mark.skipif(
    __import__("django").VERSION >= (6, 0),
    reason="checks the Django 5.2 message; 6.x has django.tasks",
)
def test_tasks_module_on_django_5_explains_it_needs_django_6():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(
        ImproperlyConfigured, match=r"exists from Django 6.0 on; this project runs Django 5\.2"
    ):
        import django_dbqueue.tasks  # noqa: F401
