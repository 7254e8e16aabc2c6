"""Helpers of the tests that start jobs of their own (cohortrun, torchrun)."""
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def cohortrun():
    """The launcher: $COHORT_RUN (CTest sets it), else the build tree's."""
    p = os.environ.get("COHORT_RUN") or os.path.join(REPO, "build", "bin", "cohortrun")
    if not os.path.exists(p):
        pytest.skip("no cohortrun at %s (set COHORT_RUN)" % p)
    return p


def job_env(**extra):
    """This environment less the variables of the pytest session's own job."""
    env = dict(os.environ)
    for k in ("COHORT_RANK", "COHORT_WORLD_SIZE", "COHORT_STORE", "COHORT_STORE_FD",
              "COHORT_LOCAL_RANK", "COHORT_LOCAL_SIZE", "RANK", "WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def world_of_one(ctx):
    if ctx.size != 1:
        pytest.skip("jobs of their own: run from the world of one")
