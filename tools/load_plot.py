#!/usr/bin/env python3
"""Plots of a cohort-load run from its per-rank CSV files (--csv PATTERN).

    /usr/bin/python3 tools/load_plot.py OUTDIR load-0.csv load-1.csv ...

Times are each row's unix_s (wall clock) relative to the earliest start of
any rank when the files have it, else t_s (seconds since that rank started:
a restarted rank's file then starts at 0; --shift=RANK=S moves it).

Writes OUTDIR/load-wait.png (mean wait for a sync group per rank over
time), load-groups.png (mean group size per rank), load-rails.png (bytes
per second each rail sent, summed over the ranks), load-resources.png (RSS
and open fds per rank: a leak shows as a slope) and prints a one-line
summary per rank. Rates come from the differences between rows.
"""
import csv
import os
import sys


def load(path):
    with open(path) as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    return rows


def deltas(rows, num, den=None):
    """(t, d num / d den) between consecutive rows (den None: per second)."""
    out = []
    for a, b in zip(rows, rows[1:]):
        dn = b[num] - a[num]
        dd = (b[den] - a[den]) if den else (b["t_s"] - a["t_s"])
        if dd > 0:
            out.append((b["t_s"], dn / dd))
    return out


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    shift = {}
    args = []
    for a in sys.argv[1:]:
        if a.startswith("--shift="):
            r, s = a[len("--shift="):].split("=")
            shift[int(r)] = float(s)
        else:
            args.append(a)
    outdir, paths = args[0], args[1:]
    os.makedirs(outdir, exist_ok=True)
    runs = {}
    for p in paths:
        rows = load(p)
        if rows:
            runs[int(rows[0]["rank"])] = rows
    # one clock for every rank: the wall clock when the files have it
    if all("unix_s" in rows[0] for rows in runs.values()):
        t0 = min(rows[0]["unix_s"] - rows[0]["t_s"] for rows in runs.values())
        for rows in runs.values():
            for x in rows:
                x["t_s"] = x["unix_s"] - t0
    for r, s in shift.items():
        for x in runs.get(r, []):
            x["t_s"] += s
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def plot(name, title, ylabel, series):
        fig, ax = plt.subplots(figsize=(8, 4))
        for label, pts in series:
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("time (s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=4)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, name), dpi=100)
        plt.close(fig)

    ranks = sorted(runs)
    plot("load-wait.png", "mean wait for a sync group", "ms per sync",
         [("rank %d" % r, [(t, v / 1000) for t, v in deltas(runs[r], "sync_wait_us", "syncs")])
          for r in ranks])
    plot("load-groups.png", "mean sync group size", "ranks",
         [("rank %d" % r, deltas(runs[r], "sync_members", "syncs")) for r in ranks])
    rails = sorted(k for k in runs[ranks[0]][0] if k.startswith("rail"))
    series = []
    for k in rails:
        total = {}
        for r in ranks:
            for t, v in deltas(runs[r], k):
                total[round(t)] = total.get(round(t), 0) + v / 1e6
        series.append((k.replace("_bytes_sent", ""), sorted(total.items())))
    plot("load-rails.png", "bytes sent per rail (all ranks)", "MB/s", series)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for r in ranks:
        a1.plot([x["t_s"] for x in runs[r]], [x["rss_mb"] for x in runs[r]], label="rank %d" % r,
                linewidth=1)
        a2.plot([x["t_s"] for x in runs[r]], [x["fds"] for x in runs[r]], linewidth=1)
    a1.set_ylabel("RSS (MB)")
    a2.set_ylabel("open fds")
    a2.set_xlabel("time (s)")
    a1.legend(fontsize=7, ncol=4)
    a1.grid(alpha=0.3)
    a2.grid(alpha=0.3)
    a1.set_title("resources per rank")
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "load-resources.png"), dpi=100)
    plt.close(fig)
    for r in ranks:
        a, b = runs[r][0], runs[r][-1]
        syncs = b["syncs"] or 1
        print("rank %d: %.0f ops, %.1f GB, %d wrong, %d errors, rss %.1f -> %.1f MB, fds %d -> %d, "
              "%d syncs, mean wait %.2f ms, mean group %.2f" % (
                  r, b["ops"], b["bytes"] / 1e9, b["wrong"], b["errors"], a["rss_mb"],
                  b["rss_mb"], a["fds"], b["fds"], b["syncs"], b["sync_wait_us"] / syncs / 1000,
                  b["sync_members"] / syncs))
    print("plots in %s: load-wait.png load-groups.png load-rails.png load-resources.png" % outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
