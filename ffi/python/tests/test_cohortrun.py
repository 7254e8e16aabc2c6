"""cohortrun as a torch user meets it: torch's variables for every rank, and
what it says when interrupted. From the world of one only (python.n1)."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from launch import cohortrun, job_env, world_of_one  # noqa: F401 - fixture


def test_exports_torch_variables():
    code = ("import os; print('VARS', *[os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', "
            "'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'COHORT_STORE')])")
    p = subprocess.run([cohortrun(), "-n", "3", "--", sys.executable, "-c", code],
                       env=job_env(RANK="99", MASTER_PORT="1"), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0, p.stdout
    rows = sorted(re.findall(r"\[(\d)\] VARS (.*)", p.stdout))
    assert len(rows) == 3, p.stdout
    ports = set()
    for r, line in rows:
        rank, size, lrank, lsize, addr, port, store = line.split()
        assert (rank, size, lrank, lsize, addr) == (r, "3", r, "3", "127.0.0.1"), line
        assert port != "1" and 0 < int(port) < 65536, line  # cohortrun's, not the caller's
        assert store != "127.0.0.1:" + port, line  # torch's store and cohort's differ
        ports.add(port)
    assert len(ports) == 1, rows  # one MASTER_PORT for the job


def test_sigint_says_which_ranks_it_stopped():
    p = subprocess.Popen([cohortrun(), "-n", "2", "--", sys.executable, "-c",
                          "import time; print('up', flush=True); time.sleep(60)"],
                         env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = 0
    t0 = time.monotonic()
    while seen < 2 and time.monotonic() - t0 < 30:
        if "up" in p.stdout.readline():
            seen += 1
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGINT, out
    assert "cohortrun: SIGINT: stopping ranks 0, 1" in out, out
    assert re.search(r"cohortrun: interrupted: rank 0 ended by \w+, rank 1 ended by \w+", out), out
