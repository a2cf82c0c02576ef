"""Lease arithmetic: renew early enough, stop trusting before others may claim."""

import pytest

from framework import leases


@pytest.mark.parametrize("ttl", [1.0, 3.0, 30.0, 300.0])
def test_two_renewals_can_fail_before_the_lease_runs_out(ttl):
    assert 2 * leases.renew_interval(ttl) < ttl
    assert 3 * leases.renew_interval(ttl) <= ttl


@pytest.mark.parametrize("ttl", [1.0, 3.0, 30.0])
def test_holder_stops_trusting_before_the_lease_expires(ttl):
    window = leases.trust_window(ttl)
    assert 0 < window < ttl
    assert leases.still_trusted(100.0, 100.0 + window - 0.01, ttl)
    assert not leases.still_trusted(100.0, 100.0 + window, ttl)
    assert not leases.still_trusted(100.0, 100.0 + ttl, ttl)


def test_backoff_doubles_and_is_capped():
    plain = [leases.retry_backoff(a, 1.0, cap=60, jitter=0) for a in range(1, 9)]
    assert plain == [1, 2, 4, 8, 16, 32, 60, 60]
    for _ in range(100):
        assert 0.8 <= leases.retry_backoff(1, 1.0, jitter=0.2) <= 1.2
