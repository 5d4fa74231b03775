"""Shared test set-up: Hypothesis profiles, chosen with HYPOTHESIS_PROFILE (default "ci").

- ci:   what CI and a plain `pytest` run: enough examples to find the usual bugs in well
        under a minute for the property tests together on a 2-core machine.
- long: `HYPOTHESIS_PROFILE=long pytest tests/property` before a release: 12x the examples
        and twice the steps per state-machine run.
- dev:  a quick smoke while editing.
No deadline in any profile: the machine is shared, so per-example timing is noise.
Tests that pass their own @settings(max_examples=...) keep that number.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("ci", max_examples=100, stateful_step_count=50, **_COMMON)
settings.register_profile("long", max_examples=1200, stateful_step_count=100, **_COMMON)
settings.register_profile("dev", max_examples=10, stateful_step_count=30, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
