"""Bounded-loss allreduces from Python (issue 11, docs/udp.md): loss_bound
on a udp rail, Result.loss, argument checks. Each test makes its own world
of two contexts in this process over lo:udp."""
import os
import threading

import numpy as np
import pytest

import cohort
from test_async import pair


def run_pair(ctxs, arrays, **kw):
    works = [c.allreduce(a, async_op=True, **kw) for c, a in zip(ctxs, arrays)]
    return [w.wait() for w in works]


def finalize(ctxs):
    """Both at once: a rank's finalize waits for its peers' (up to a deadline)."""
    ts = [threading.Thread(target=c.finalize) for c in ctxs]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)


def test_loss_bound_exact_without_loss():
    os.environ.pop("COHORT_TEST_UDP_DROP_PPM", None)
    ctxs = pair(nics="lo:udp")
    try:
        n = 300001
        arrays = [np.arange(n, dtype=np.float32) + r for r in (0, 1)]
        res = run_pair(ctxs, arrays, loss_bound=1e-9, layer=3, nlayers=8)
        want = 2 * np.arange(n, dtype=np.float32) + 1
        for a, r in zip(arrays, res):
            assert np.array_equal(a, want)
            assert r.loss is not None
            assert r.loss["push_lost_bytes"] == 0 and r.loss["pull_lost_bytes"] == 0
            assert r.loss["push_bytes"] > 0 and r.loss["pull_bytes"] > 0
        # Without a bound: the reliable path, no loss report.
        res = run_pair(ctxs, arrays)
        assert all(r.loss is None for r in res)
    finally:
        finalize(ctxs)


def test_loss_bound_with_drops():
    os.environ["COHORT_TEST_UDP_DROP_PPM"] = "50000"  # read at init
    try:
        ctxs = pair(nics="lo:udp")
    finally:
        del os.environ["COHORT_TEST_UDP_DROP_PPM"]
    try:
        n = 1 << 18
        want = [0, 0]  # (expected, missed) bytes the results report, per rank
        missed = [0, 0]
        for _ in range(3):
            arrays = [np.full(n, 1 << r, dtype=np.float64) for r in (0, 1)]
            res = run_pair(ctxs, arrays, loss_bound=0.1, pull_loss_bound=0.02)
            for rank, (a, r) in enumerate(zip(arrays, res)):
                want[rank] += r.loss["push_bytes"] + r.loss["pull_bytes"]
                missed[rank] += r.loss["push_lost_bytes"] + r.loss["pull_lost_bytes"]
                assert r.loss["push_lost"] <= 0.1 and r.loss["pull_lost"] <= 0.02
                # 3: both arrived; this rank's own value: a lost pull, or a
                # lost push into this rank's block (what its report counts);
                # the other's value: a push lost into the other's block
                assert set(np.unique(a)) <= {3.0, 1.0, 2.0}
                own = int(np.count_nonzero(a == float(1 << rank))) * 8
                assert own == r.loss["push_lost_bytes"] + r.loss["pull_lost_bytes"]
        # cohort.stats(): the same bytes summed (loss fraction = missed / expected)
        for rank, c in enumerate(ctxs):
            st = c.stats()
            assert st["loss_bytes_expected"] == want[rank] > 0, (st, want)
            assert st["loss_bytes_missed"] == missed[rank], (st, missed)
    finally:
        finalize(ctxs)


@pytest.mark.parametrize("kw,field", [
    ({"loss_bound": 1.0}, "loss_bound"),
    ({"loss_bound": -0.1}, "loss_bound"),
    ({"pull_loss_bound": "x"}, "pull_loss_bound"),
    ({"loss_bound": 0.1, "layer": 2}, "layer"),
    ({"loss_bound": 0.1, "layer": 8, "nlayers": 8}, "layer"),
    ({"loss_bound": 0.1, "algo": "relay"}, "loss_bound"),
])
def test_loss_bound_arguments(ctx, kw, field):
    with pytest.raises(cohort.errors.InvalidArgumentError) as ei:
        ctx.allreduce(np.zeros(4, dtype=np.float32), **kw)
    assert ei.value.field == field
