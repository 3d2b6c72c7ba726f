"""pytest fixtures of django_dbqueue.testing, loaded through the ``pytest11`` entry point.

``dbqueue``: the helpers, with the database that pytest-django's ``db`` fixture gives the test
(its transaction; ``transactional_db`` or ``@pytest.mark.django_db(transaction=True)`` for
autocommit). ``dbqueue_inline``: the same, with ``inline()`` on for the whole test.

Nothing is imported from Django or the package until a test asks for a fixture: a project that
has the package installed without using pytest-django (or Django) in its tests loads this
module and nothing else happens.
"""

try:
    import pytest  # present wherever this is loaded: pytest loads it (its pytest11 entry point)
except ImportError as exc:  # pragma: no cover - imported by hand without pytest installed
    raise ImportError(
        "django_dbqueue.testing.pytest_plugin is a pytest plugin; pytest is not installed"
    ) from exc


class DBQueueHelpers:
    """The helpers of ``django_dbqueue.testing`` as methods, on one database alias."""

    def __init__(self, using=None):
        from django_dbqueue import testing

        self._testing = testing
        self.using = using

    def enqueued_jobs(self, type=None, payload=None, **kwargs):
        return self._testing.enqueued_jobs(type, payload, using=self.using, **kwargs)

    def assert_enqueued(self, type=None, payload=None, **kwargs):
        return self._testing.assert_enqueued(type, payload, using=self.using, **kwargs)

    def refute_enqueued(self, type=None, payload=None, **kwargs):
        return self._testing.refute_enqueued(type, payload, using=self.using, **kwargs)

    def run_jobs(self, queues=None, types=None, **kwargs):
        return self._testing.run_jobs(queues, types, using=self.using, **kwargs)

    def perform_job(self, type, payload=None, **context):
        return self._testing.perform_job(type, payload, using=self.using, **context)

    def inline(self, queues=None, types=None):
        return self._testing.inline(queues, types, using=self.using)

    def left_running(self):
        """Jobs this test's helpers claimed and left ``running`` (:func:`jobs_left_running`)."""
        return self._testing.jobs_left_running(using=self.using)


def _finish(helpers):
    left = helpers.left_running()
    if left:
        pytest.fail(
            "the test left jobs running that django_dbqueue.testing claimed: "
            + ", ".join(job.describe() for job in left),
            pytrace=False,
        )


@pytest.fixture
def dbqueue(db):
    """django_dbqueue.testing's helpers (``dbqueue.run_jobs()``, ``dbqueue.assert_enqueued()``,
    ...) in the test's database. Fails the test at teardown if it left jobs running."""
    helpers = DBQueueHelpers()
    yield helpers
    _finish(helpers)


@pytest.fixture
def dbqueue_inline(db):
    """:func:`dbqueue`, with jobs run at the commit that enqueued them for the whole test
    (``inline()``); ``dbqueue_inline.mode.ran`` lists what ran."""
    helpers = DBQueueHelpers()
    with helpers.inline() as mode:
        helpers.mode = mode
        yield helpers
    _finish(helpers)
