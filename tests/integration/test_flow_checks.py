"""System checks and @job validation of the flow-control options (dbqueue.E011, E012)."""

import pytest

from django_dbqueue import JobRegistrationError, job, registry
from django_dbqueue.checks import check_settings
from django_dbqueue.registry import JobType


def found(settings, **queue_options):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": queue_options}}
    return [(m.id, m.msg) for m in check_settings()]


def test_valid_flow_options_are_clean(settings):
    assert found(settings, global_concurrency=5) == []
    assert found(settings, rate_limit={"limit": 100, "period": 60, "key": "account_id"}) == []
    assert found(settings, rate_limit={"limit": 1, "period": 0.5}) == []


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"global_concurrency": 0}, "['global_concurrency'] must be an integer from 1"),
        ({"global_concurrency": "5"}, "got '5'"),
        ({"global_concurrency": True}, "got True"),
        ({"rate_limit": 100}, "must be a dict like"),
        ({"rate_limit": {"limit": 0, "period": 60}}, "['limit'] must be an integer from 1"),
        ({"rate_limit": {"limit": 5}}, "needs 'period'"),
        ({"rate_limit": {"limit": 5, "period": 0}}, "['period'] must be a number of seconds"),
        ({"rate_limit": {"limit": 5, "period": 1, "per": 2}}, "unknown key(s) 'per'"),
        ({"rate_limit": {"limit": 5, "period": 1, "key": "account.id"}}, "payload field name"),
        ({"rate_limit": {"limit": 5, "period": 1, "key": "1st"}}, "got '1st'"),
        ({"rate_limit": {"limit": 5, "period": 1, "key": ""}}, "payload field name"),
    ],
)
def test_e011_bad_queue_flow_option(options, fragment, settings):
    result = found(settings, **options)
    assert [i for i, _ in result] == ["dbqueue.E011"], result
    assert fragment in result[0][1] and "'emails'" in result[0][1], result


def test_e002_misspelt_queue_option_suggests_the_flow_option(settings):
    settings.DBQUEUE = {"QUEUES": {"default": {"global_concurency": 3}}}
    [message] = check_settings()
    assert message.id == "dbqueue.E002" and "Did you mean 'global_concurrency'?" in message.hint


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"global_concurrency": 0}, "global_concurrency must be an integer from 1"),
        ({"rate_limit": {"limit": 2}}, "rate_limit needs 'period'"),
        ({"rate_limit": {"limit": 2, "period": 1, "key": "a-b"}}, "payload field name"),
    ],
)
def test_job_refuses_bad_flow_options(kwargs, fragment):
    with pytest.raises(JobRegistrationError, match="flow-bad") as info:
        job("flow-bad", **kwargs)(lambda ctx: None)
    assert fragment in str(info.value)
    assert registry.get("flow-bad") is None


def test_job_normalises_its_rate_limit():
    try:
        job("flow-ok", global_concurrency=2, rate_limit={"limit": 3, "period": 2})(lambda ctx: None)
        t = registry.get("flow-ok")
        assert t.global_concurrency == 2
        assert t.rate_limit == {"limit": 3, "period": 2.0, "key": None}
    finally:
        registry.unregister("flow-ok")


def test_e012_type_registered_without_job(settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}}}
    registry.register(JobType(name="flow-raw", func=lambda ctx: None, global_concurrency=-1))
    try:
        [message] = [m for m in check_settings() if m.id == "dbqueue.E012"]
        assert "'flow-raw'" in message.msg and "global_concurrency" in message.msg
    finally:
        registry.unregister("flow-raw")
