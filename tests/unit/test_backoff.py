"""Properties of the pure retry schedule (no database)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_dbqueue.backoff import Backoff, ceiling, constant

bases = st.floats(min_value=0.001, max_value=1000)
factors = st.floats(min_value=1, max_value=10)
attempts = st.integers(min_value=1, max_value=10_000)


@given(base=bases, factor=factors, extra=st.floats(min_value=0, max_value=1e6), attempt=attempts)
def test_ceiling_starts_at_base_grows_and_never_passes_the_cap(base, factor, extra, attempt):
    cap = base + extra
    assert ceiling(1, base=base, factor=factor, cap=cap) == pytest.approx(min(base, cap))
    here = ceiling(attempt, base=base, factor=factor, cap=cap)
    after = ceiling(attempt + 1, base=base, factor=factor, cap=cap)
    assert base * (1 - 1e-9) <= here <= cap
    assert after >= here * (1 - 1e-12)


@given(attempt=st.integers(min_value=1, max_value=60))
def test_ceiling_is_exponential_below_the_cap(attempt):
    assert ceiling(attempt, base=1, factor=2, cap=float("inf")) == 2 ** (attempt - 1)


@given(attempt=attempts, u=st.floats(min_value=0, max_value=1, exclude_max=True))
def test_full_jitter_stays_within_zero_and_the_ceiling(attempt, u):
    schedule = Backoff(base=2, factor=2, cap=3600)
    delay = schedule(attempt, rng=lambda: u)
    assert 0 <= delay <= schedule.ceiling(attempt)
    assert delay == pytest.approx(u * schedule.ceiling(attempt))


def test_jitter_spreads_a_burst_over_the_window():
    schedule = Backoff(base=10, factor=2, cap=3600)
    delays = [schedule(5) for _ in range(2000)]
    bound = schedule.ceiling(5)  # 160 s
    assert min(delays) < 0.1 * bound and max(delays) > 0.9 * bound
    assert len({round(d, 3) for d in delays}) > 1900  # no lock-step retries


def test_no_jitter_gives_the_ceiling_and_constant_is_constant():
    assert Backoff(base=3, factor=3, cap=100, jitter=False)(3) == 27
    assert Backoff(base=3, factor=3, cap=100, jitter=False)(10) == 100
    assert constant(7)(1) == constant(7)(99) == 7


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"base": 0}, ValueError, "Backoff.base must be > 0"),
        ({"factor": 0.5}, ValueError, "Backoff.factor must be >= 1"),
        ({"base": 10, "cap": 5}, ValueError, "must be >= base"),
        ({"base": "1"}, TypeError, "Backoff.base must be a number"),
    ],
)
def test_bad_backoff_arguments(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        Backoff(**kwargs)


def test_attempt_must_be_positive():
    with pytest.raises(ValueError, match="attempt must be >= 1"):
        Backoff()(0)


def test_backoff_module_does_not_import_django():
    import subprocess
    import sys

    # Load backoff.py by path, so that the check is of the module itself, whatever the package imports.
    code = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('b', "
        "'django_dbqueue/backoff.py'); m = importlib.util.module_from_spec(spec); "
        "spec.loader.exec_module(m); print('django' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
