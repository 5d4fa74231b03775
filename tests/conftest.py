"""Shared test set-up: Hypothesis profiles, and tests that run alone under pytest-xdist.

Hypothesis profiles, chosen with HYPOTHESIS_PROFILE (default "ci"):

- ci:   what CI and a plain `pytest` run: enough examples to find the usual bugs in well
        under a minute for the property tests together on a 2-core machine.
- long: `HYPOTHESIS_PROFILE=long pytest tests/property` before a release: 12x the examples
        and twice the steps per state-machine run.
- dev:  a quick smoke while editing.
No deadline in any profile: the machine is shared, so per-example timing is noise.
Tests that pass their own @settings(max_examples=...) keep that number.
"""
from __future__ import annotations

import contextlib
import fcntl
import os

import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("ci", max_examples=100, stateful_step_count=50, **_COMMON)
settings.register_profile("long", max_examples=1200, stateful_step_count=100, **_COMMON)
settings.register_profile("dev", max_examples=10, stateful_step_count=30, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# pyproject's addopts run the suite on two xdist workers. A test marked `alone` (it times something against
# the wall clock: /health latency, 2-second collective timeouts) runs while the other worker runs nothing:
# every test holds a shared lock through its setup, call and teardown, an `alone` test an exclusive one.
# A turnstile taken first gives a waiting `alone` test priority over the next shared ones.
@contextlib.contextmanager
def _worker_lock(folder, exclusive: bool):
    with open(folder / "alone.turnstile", "a") as turnstile, open(folder / "alone.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    folder = item.config._tmp_path_factory.getbasetemp().parent  # shared by the run's workers
    with _worker_lock(folder, item.get_closest_marker("alone") is not None):
        yield
