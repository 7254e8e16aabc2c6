#!/usr/bin/python3
"""Plots for `cohort-sim sweep` (Figures 5-14 of seeds/001, plus the extra
sweeps of docs/sched.md), a summary CSV and the headline table.

usage: sim_plot.py DIR      reads DIR/sweep.csv, writes DIR/*.png,
                            DIR/summary.csv and DIR/headline.md

Each point is the median over seeds with a bar from the minimum to the
maximum, as the paper reports its 20 trials. Needs numpy and matplotlib
(Debian: python3-matplotlib).
"""
import csv
import os
import sys
from collections import defaultdict

import numpy as np
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METRICS = [
    ("avg_sync_time_s", "average sync time (s)"),
    ("avg_sync_scale", "average sync scale"),
    ("total_iteration", "total iteration"),
    ("total_sync", "total sync"),
]
WASTE = ("wasted_wait_ms_per_worker", "wasted wait time per worker (ms)")
STYLE = {"allreduce": ("tab:gray", "s"), "partial": ("tab:blue", "o"),
         "selective": ("tab:red", "^"), "relay": ("tab:green", "D")}
VARIANT_STYLE = {"cold": "--", "warm": "-", "printed": "-", "conditional": "--", "": "-"}

# sweep name -> (file, title, x label)
FIGS = {
    "n_cnn": ("fig05_cnn_n.png", "CNN trace (synthetic 'cnn')", "number of workers n"),
    "n_transformer": ("fig06_transformer_n.png", "Transformer trace (synthetic)",
                      "number of workers n"),
    "p": ("fig08_p.png", "impact of p (Transformer, n = 200)", "p / n"),
    "eta": ("fig09_eta.png", "impact of eta (Transformer, n = 200)", "eta"),
    "theta": ("fig10_theta.png", "impact of theta (Transformer, n = 200)", "theta"),
    "bw_error": ("fig12_bw_error.png", "bandwidth estimation error (Transformer, n = 200)",
                 "error scale e"),
    "lambda": ("fig13_lambda.png", "bandwidth skewness (Transformer, n = 200)", "lambda"),
    "alpha": ("fig14_alpha.png", "latency alpha (Transformer, n = 200)", "alpha (ms)"),
    "eq4_cnn": ("eq4_cnn.png", "Eq. 4 readings, selective (cnn)", "number of workers n"),
    "eq4_transformer": ("eq4_transformer.png", "Eq. 4 readings, selective (transformer)",
                        "number of workers n"),
    "dt": ("dt.png", "selective: time slot dt (Transformer, n = 200)", "dt (ms)"),
    "compute": ("compute.png", "compute time scale (Transformer, n = 200)",
                "compute time multiplier"),
    "relay": ("relay.png", "AdapCC relay vs allreduce: n = 40, 25 MB, one straggler",
              "straggler slowdown (x)"),
}


def load(path):
    rows = defaultdict(list)  # (sweep, variant, dist, scheme, x) -> [row]
    with open(path) as f:
        for r in csv.DictReader(f):
            key = (r["sweep"], r["variant"], r["dist"], r["scheme"], float(r["x"]))
            rows[key].append({k: float(r[k]) for k, _ in METRICS + [WASTE]})
    return rows


def stats(vals):
    a = np.array(vals)
    return np.min(a), np.median(a), np.max(a)


def series(rows, sweep):
    """label -> (scheme, variant, sorted xs, {metric: (mins, meds, maxs)})"""
    out = {}
    keys = sorted({(k[3], k[1]) for k in rows if k[0] == sweep})
    for scheme, variant in keys:
        xs = sorted({k[4] for k in rows if k[0] == sweep and k[3] == scheme and k[1] == variant})
        data = {}
        for m, _ in METRICS + [WASTE]:
            lo, med, hi = [], [], []
            for x in xs:
                vals = [r[m] for k, rs in rows.items()
                        if k[0] == sweep and k[3] == scheme and k[1] == variant and k[4] == x
                        for r in rs]
                a, b, c = stats(vals)
                lo.append(a)
                med.append(b)
                hi.append(c)
            data[m] = (np.array(lo), np.array(med), np.array(hi))
        label = scheme + (f" ({variant})" if variant else "")
        out[label] = (scheme, variant, np.array(xs), data)
    return out


def draw(ax, ser, metric, ylabel, xlabel):
    for label, (scheme, variant, xs, data) in ser.items():
        color, marker = STYLE.get(scheme, ("k", "x"))
        lo, med, hi = data[metric]
        ax.errorbar(xs, med, yerr=[med - lo, hi - med], label=label, color=color, marker=marker,
                    linestyle=VARIANT_STYLE.get(variant, "-"), capsize=3, markersize=4)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def four_panels(rows, sweep, out_dir):
    fname, title, xlabel = FIGS[sweep]
    ser = series(rows, sweep)
    if not ser:
        return None
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for ax, (m, yl), tag in zip(axes, METRICS, "abcd"):
        draw(ax, ser, m, yl, xlabel)
        ax.set_title(f"({tag}) {yl}", fontsize=10)
    if sweep == "alpha":
        for ax in axes:
            ax.set_xscale("symlog", linthresh=1)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = os.path.join(out_dir, fname)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def wasted(rows, out_dir):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    done = False
    for ax, sweep, title in zip(axes, ["n_cnn", "n_transformer"], ["cnn", "transformer"]):
        ser = series(rows, sweep)
        if ser:
            done = True
            draw(ax, ser, WASTE[0], WASTE[1], "number of workers n")
            ax.set_title(title, fontsize=10)
            ax.legend(fontsize=8)
    if not done:
        plt.close(fig)
        return None
    fig.suptitle("Fig. 7: wasted wait time per worker (100 s runs)")
    fig.tight_layout()
    path = os.path.join(out_dir, "fig07_wasted.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def start_fig(rows, out_dir):
    ser = series(rows, "start")
    if not ser:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.6))
    draw(ax, ser, "avg_sync_time_s", "average sync time (s)", "number of workers n")
    ax.legend(fontsize=8)
    ax.set_title("Fig. 11: cold vs warm start (selective)", fontsize=10)
    fig.tight_layout()
    path = os.path.join(out_dir, "fig11_start.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summary(rows, out_dir):
    path = os.path.join(out_dir, "summary.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        head = ["sweep", "variant", "dist", "scheme", "x", "seeds"]
        for m, _ in METRICS + [WASTE]:
            head += [m + "_min", m + "_median", m + "_max"]
        w.writerow(head)
        for key in sorted(rows):
            rs = rows[key]
            line = [key[0], key[1], key[2], key[3], f"{key[4]:g}", len(rs)]
            for m, _ in METRICS + [WASTE]:
                line += [f"{v:.6g}" for v in stats([r[m] for r in rs])]
            w.writerow(line)
    return path


def headline(rows, out_dir):
    """Selective vs partial on the two traces, ratio of medians per n."""
    lines = ["| trace | n | sync time: partial / selective | scale: selective / partial "
             "| total iteration: selective / partial | total sync: selective / partial "
             "| wasted wait (ms/worker, selective) |",
             "|---|---|---|---|---|---|---|"]
    found = False
    for sweep, name in [("n_cnn", "cnn"), ("n_transformer", "transformer")]:
        xs = sorted({k[4] for k in rows if k[0] == sweep})
        for x in xs:
            def med(scheme, m):
                vals = [r[m] for k, rs in rows.items()
                        if k[0] == sweep and k[3] == scheme and k[4] == x for r in rs]
                return float(np.median(vals)) if vals else float("nan")
            p_t, s_t = med("partial", "avg_sync_time_s"), med("selective", "avg_sync_time_s")
            if np.isnan(p_t) or np.isnan(s_t):
                continue
            found = True
            lines.append(
                f"| {name} | {x:g} | {p_t / s_t:.2f}x | "
                f"{med('selective', 'avg_sync_scale') / med('partial', 'avg_sync_scale'):.2f}x | "
                f"{med('selective', 'total_iteration') / med('partial', 'total_iteration'):.2f}x | "
                f"{med('selective', 'total_sync') / med('partial', 'total_sync'):.2f}x | "
                f"{med('selective', WASTE[0]):.2f} |")
    if not found:
        return None
    path = os.path.join(out_dir, "headline.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    rows = load(os.path.join(out_dir, "sweep.csv"))
    written = []
    for sweep in FIGS:
        written.append(four_panels(rows, sweep, out_dir))
    written += [wasted(rows, out_dir), start_fig(rows, out_dir), summary(rows, out_dir),
                headline(rows, out_dir)]
    for p in written:
        if p:
            print("sim_plot:", p)


if __name__ == "__main__":
    main()
