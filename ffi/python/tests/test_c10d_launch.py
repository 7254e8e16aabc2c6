"""torch.distributed jobs on the "cohort" backend, each launched as a new
user would: under cohortrun (4 ranks, 2 ranks, a rank that raises, a
straggler, a short group timeout) and under torchrun. Run from the world of
one only (python.n1): each test starts its own job of c10d_worker.py."""
import os
import re
import subprocess
import sys

import pytest

if os.environ.get("COHORT_SKIP_TORCH"):
    pytest.skip(os.environ["COHORT_SKIP_TORCH"], allow_module_level=True)
pytest.importorskip("torch", reason="torch is not installed (apt-get install python3-torch)")
try:
    import cohort.torch  # noqa: F401
except ImportError as e:
    pytest.skip(str(e), allow_module_level=True)

from launch import HERE, cohortrun, job_env, world_of_one  # noqa: E402,F401 - fixture

WORKER = os.path.join(HERE, "c10d_worker.py")


def _run(args, timeout=240, **env):
    p = subprocess.run(args, env=job_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout, text=True)
    return p.returncode, p.stdout


def _cohort_job(n, mode, extra=(), **env):
    return _run([cohortrun(), "-n", str(n), *extra, "--", sys.executable, WORKER, mode], **env)


def _passes(out, mode):
    return re.findall(r"PASS %s rank (\d+).*" % mode, out)


@pytest.mark.parametrize("n", [2, 4])
def test_calls(n):
    rc, out = _cohort_job(n, "calls")
    assert rc == 0, out
    assert sorted(_passes(out, "calls")) == [str(r) for r in range(n)], out


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_matches_gloo(n):
    """DDP on cohort (no gloo group, no hook) vs DDP on gloo, same seed and
    data, 100 steps: equal within float tolerance; bit for bit at 2 ranks
    (a single addition per element either way)."""
    rc, out = _cohort_job(n, "ddp")
    assert rc == 0, out
    lines = re.findall(r"PASS ddp rank \d+ of \d+: .*bitwise equal: (\w+)", out)
    assert len(lines) == n, out
    if n == 2:
        assert set(lines) == {"True"}, out


def test_rank_raising_gives_runtime_errors():
    """Rank 1 raises at step 5 of a DDP loop: ranks 0, 2, 3 each get a
    RuntimeError with cohort's text within seconds (not a hang, not a
    garbled cast error)."""
    rc, out = _cohort_job(4, "raise", extra=["--keep-going", "--timeout", "120"])
    assert rc == 1, out  # rank 1's own exit status
    assert "rank 1 fails on purpose" in out, out
    got = re.findall(r"PASS raise rank (\d+): RuntimeError after ([\d.]+) s: (.*)", out)
    assert sorted(r for r, _, _ in got) == ["0", "2", "3"], out
    for _, took, msg in got:
        assert float(took) < 10, out
        assert msg.startswith("cohort ") and "EPEER" in msg, out


def test_group_timeout_is_the_op_timeout():
    rc, out = _cohort_job(2, "timeout")
    assert rc == 0, out
    assert "PASS timeout rank 0" in out and "ETIMEDOUT" in out, out


def test_partial_sync_with_a_straggler():
    rc, out = _cohort_job(4, "partial", SECONDS_BUDGET="2")
    assert rc == 0, out
    got = re.findall(r"PASS partial rank (\d+) of 4: (\d+) steps", out)
    assert len(got) == 4, out
    steps = {int(r): int(s) for r, s in got}
    # the straggler (rank 3, 50 ms a step) did not hold the others back
    assert min(steps[r] for r in range(3)) > 3 * steps[3], out


def test_torchrun():
    """Under torchrun, unchanged. torch 1.13's torchrun on Python 3.11 dies
    in its own log setup ('NoneType' object has no attribute 'get') unless
    --redirects and --tee are given: docs/torch.md."""
    rc, out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", "2", "--redirects", "1", "--tee", "1", WORKER, "calls"])
    assert rc == 0, out
    assert len(re.findall(r"PASS calls rank \d of 2", out)) == 2, out
