"""bench/idle_rss.py - resident memory before, after large ops and after an idle period.

Each rank (under cohortrun) runs three rounds of a 64 MiB reduce-scatter and a
64 MiB allreduce, rank 0 entering every round late so that the others' frames
reach it before its receives (the rail's stash), then sleeps IDLE_S seconds
(default 7) and prints its RSS at the three points. With COHORT_SPARE_IDLE_MS
(5000 by default) shorter than the sleep, the rails free the buffers they kept
for later ops (docs/perf.md, "Kept buffers are freed when the rail idles"):

  COHORT_SHM=0 PYTHONPATH=ffi/python COHORT_LIBRARY=build/lib/libcohort.so \\
      build/bin/cohortrun -n 4 -- /usr/bin/python3 bench/idle_rss.py
RS=0 or AR=0 leaves out the reduce-scatters or the allreduces.
"""
import os
import time

import numpy as np

import cohort


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main():
    c = cohort.init()
    r, n = c.rank, c.size
    x = np.ones(16 << 20, dtype=np.float32)  # 64 MiB
    out = np.zeros((16 << 20) // n, dtype=np.float32)
    c.allreduce(np.ones(1, dtype=np.float32))
    before = rss_mib()
    for _ in range(3):
        if r == 0:
            time.sleep(0.3)
        if os.environ.get("RS", "1") == "1":
            c.reduce_scatter(out, x)
        if os.environ.get("AR", "1") == "1":
            c.allreduce(x)
    after = rss_mib()
    time.sleep(float(os.environ.get("IDLE_S", "7")))
    idle = rss_mib()
    c.allreduce(np.ones(1, dtype=np.float32))
    print("rank %d: RSS MiB before %.0f, after the ops %.0f, after idle %.0f" % (r, before, after, idle),
          flush=True)
    c.finalize()


if __name__ == "__main__":
    main()
