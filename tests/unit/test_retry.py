import random

import pytest

from django_pgqueue.retry import ExponentialBackoff, FixedDelay, RetryPolicy


def test_full_jitter_stays_within_the_exponential_ceiling():
    policy = ExponentialBackoff(base=1.0, cap=60.0, rng=random.Random(7))
    for attempt in range(1, 12):
        ceiling = min(60.0, 2.0 ** (attempt - 1))
        delays = [policy.delay(attempt) for _ in range(500)]
        assert all(0.0 <= d <= ceiling for d in delays)
        # Full jitter uses the whole range, not just its top.
        assert min(delays) < ceiling * 0.1
        assert max(delays) > ceiling * 0.9


def test_full_jitter_spreads_a_burst_of_failures():
    policy = ExponentialBackoff(base=1.0, cap=100.0, rng=random.Random(1))
    seconds = [int(policy.delay(8)) for _ in range(1000)]  # ceiling 128 -> capped at 100
    busiest = max(seconds.count(s) for s in set(seconds))
    assert busiest < 40  # fixed delay would put all 1000 in one second


def test_ceiling_survives_huge_attempt_numbers():
    assert ExponentialBackoff(base=2, cap=30).ceiling(10_000) == 30


def test_fixed_delay_is_fixed():
    policy = FixedDelay(3)
    assert {policy.delay(n) for n in range(1, 10)} == {3.0}


@pytest.mark.parametrize(
    "make",
    [
        lambda: ExponentialBackoff(base=-1),
        lambda: ExponentialBackoff(base=10, cap=5),
        lambda: ExponentialBackoff(cap=float("inf")),
        lambda: FixedDelay(-2),
        lambda: FixedDelay("5"),
    ],
)
def test_bad_parameters_are_refused(make):
    with pytest.raises(ValueError, match="must be"):
        make()


def test_policies_satisfy_the_protocol():
    assert isinstance(ExponentialBackoff(), RetryPolicy)
    assert isinstance(FixedDelay(), RetryPolicy)
