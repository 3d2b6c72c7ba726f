"""@job registration errors: duplicates name both places, wrong signatures and options."""

import pytest

from django_dbqueue import JobRegistrationError, job, registry, validation


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


def _handler(ctx):
    return None


async def _async_handler(ctx):
    return None


# Every option of @job, given a value of the wrong kind: a named error (a JobRegistrationError,
# which is a ValueError too) that names the option and shows the value, and nothing registered.
@pytest.mark.parametrize(
    ("args", "kwargs", "fragment"),
    [
        ((["x"],), {}, "@job(name): the job type name must be a str, such as"),
        ((b"x",), {}, 'the job type name must be a str, such as @job("send-invoice-email")'),
        (("",), {}, "@job type name must be a non-empty string of at most 200 characters"),
        (("a\x00",), {}, "@job type name 'a\\x00' contains a NUL character"),
        (("opts",), {"queue": ["default"]}, "@job('opts'): queue must be a non-empty string"),
        (("opts",), {"max_attempts": 2.0}, "max_attempts must be an integer from 1"),
        (("opts",), {"lease": "60"}, "lease must be a number of seconds, got '60'"),
        (("opts",), {"timeout": True}, "timeout must be a number of seconds, got True"),
        (("opts",), {"backoff": "exp"}, "backoff must be callable"),
        (("opts",), {"priority": None}, "priority must be an integer from -100 to 100"),
        (("opts",), {"atomic": "yes"}, "@job('opts'): atomic must be True or False, got 'yes'"),
        (("opts",), {"atomic": 1}, "atomic must be True or False, got 1"),
        (("opts",), {"atomic": None}, "atomic must be True or False, got None"),
        (("opts",), {"global_concurrency": True}, "global_concurrency must be an integer from 1"),
        (("opts",), {"rate_limit": ["x"]}, "rate_limit must be a dict like"),
        (("opts",), {"rate_limit": {1: 2}}, "rate_limit has unknown key(s) 1"),
        (("opts",), {"unique_key": "k"}, "unique_key must be a callable of the payload"),
        (("opts",), {"unique_while": ["active"]}, "unique_while must be 'pending' or 'active'"),
        (("opts",), {"serial_key": 5}, "serial_key must be a callable of the payload"),
    ],
)
def test_every_option_of_the_wrong_kind_is_a_named_error(args, kwargs, fragment):
    with pytest.raises(JobRegistrationError) as caught:
        job(*args, **kwargs)(_handler)
    assert isinstance(caught.value, ValueError)
    assert fragment in str(caught.value)
    assert registry.get("opts") is None


@pytest.mark.parametrize("func", [None, "handler", 3, object()])
def test_a_handler_that_is_not_callable_is_a_named_error(func):
    with pytest.raises(JobRegistrationError, match="is not a callable object"):
        job("not-callable")(func)
    assert registry.get("not-callable") is None


def test_an_atomic_async_handler_without_a_qualname_is_refused_by_name():
    import functools

    with pytest.raises(JobRegistrationError, match=r"atomic=True needs a plain \(sync\)"):
        job("atomic-partial", atomic=True)(functools.partial(_async_handler))
    assert registry.get("atomic-partial") is None


# The type name of the wrong kind (issue 35): a TypeError naming the argument, not only a
# ValueError, and never an AttributeError from deeper down.
@pytest.mark.parametrize("name", [["x"], ("x",), {"x"}, None, 5, b"x"])
def test_a_type_name_that_is_no_str_is_a_type_error_naming_the_argument(name):
    with pytest.raises(TypeError) as caught:
        job(name)
    assert isinstance(caught.value, JobRegistrationError)  # still caught as before
    message = str(caught.value)
    assert message.startswith("@job(name): the job type name must be a str"), message
    assert validation.shown(name) in message


def test_a_bare_job_decorator_is_told_to_give_the_name():
    with pytest.raises(TypeError, match=r"@job\(\"type-name\"\)"):

        @job
        def handler(ctx):
            pass


def test_retry_job_names_its_bound():
    from django_dbqueue import RetryJob

    for delay in (10**20, 2592001, -1, float("nan"), float("inf"), 10**5000, "60"):
        with pytest.raises(ValueError) as caught:
            RetryJob(delay)
        message = str(caught.value)
        assert message.startswith("RetryJob(delay): a number of seconds from 0 to 2592000 "), (
            message
        )
        assert "(30 days, the longest retry delay)" in message
        assert validation.shown(delay) in message
    assert RetryJob(2592000).delay == 2592000.0


def test_retry_jobs_bound_is_the_longest_delay_a_retry_is_given():
    from django_dbqueue.exceptions import MAX_RETRY_DELAY
    from django_dbqueue.outcomes import MAX_DELAY

    assert MAX_RETRY_DELAY == MAX_DELAY  # what RetryJob refuses is what the worker would cap
