"""Shared fixtures. The tests run in a world of one (plain pytest) or under
cohortrun (every rank runs the same tests in the same order):

    COHORT_LIBRARY=build/lib/libcohort.so PYTHONPATH=ffi/python \
        build/bin/cohortrun -n 3 -- /usr/bin/python3 -m pytest -q -p no:cacheprovider ffi/python/tests
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import cohort  # noqa: E402


@pytest.fixture(scope="session")
def ctx():
    c = cohort.init(log_level="warn")
    yield c
    # Everyone reaches the end before anyone finalizes: a rank that leaves
    # early would fail its peers' last collectives.
    c.barrier()
    c.finalize()


@pytest.fixture
def rank(ctx):
    return ctx.rank


@pytest.fixture
def size(ctx):
    return ctx.size
