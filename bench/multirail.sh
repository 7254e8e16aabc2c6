#!/usr/bin/env bash
# bench/multirail.sh - the multi-rail figures (docs/multirail.md), measured side
# by side in one run, in a namespace cluster (tests/cluster), root only.
#
#   bench/multirail.sh [--build DIR] [--rate R] [--slow S] [--cuts N] [--out DIR]
#
#   --build DIR  build tree with bin/cohortrun, bin/rails-stream and
#                bin/cluster-probe (default: $COHORT_BUILD, else build)
#   --rate R     Mbit/s of every rail of cluster A (default 300)
#   --slow S     Mbit/s of the slow rail of cluster B, whose other rail runs at R
#                (default 100: rails at 1:3)
#   --cuts N     cuts in the failover stream (default 20)
#   --out DIR    where the logs, per-op CSVs and the summary go
#                (default /tmp/cohort-multirail.<time>)
#
# 4 ranks; every op is an f32 sum allreduce run by tests/cluster/rails-stream,
# which checks every element exactly and times every op on rank 0. A size's
# time is the median over its ops; throughput = bytes / time (so throughput
# ratios are busbw ratios too).
#
# Cluster A: 2 rails per rank, both at R.
#   0. measure.sh: what every rank's links deliver, up and down (TCP payload).
#   1. 1 rail (--nics eth0, then --nics eth1) and 2 rails (eth0,eth1), sizes
#      4K, 16K, 64K (300 ops), 4M (8) and 16M (5), two rounds interleaved (each config's best
#      median is kept, against the noise of a shared machine):
#        2 rails / best single rail throughput at >= 1 MiB   (goal >= 1.85x)
#        2-rail time / best single-rail time at 4K..64K     (goal <= 1.05x)
#   1b. two rails on one interface (--nics eth0,eth0, Nezha's virtual
#      multi-rail), 4M: throughput against one rail (no goal: they share it).
#   2. failover: a stream of 4 MiB ops on 2 rails; N times, rank 2's eth1 goes
#      down for 0.5 s and comes back, and the next cut waits until every link
#      that failed over is back (return log lines) and the ops are back at the
#      2-rail time (3 in a row within 1.2x; the balancer drops a rail that
#      failed over from its table until it returns). Per cut, the op in
#      flight at the cut: its duration minus the median op duration (extra);
#      p50 and p99 of it (goal p99 <= 200 ms); the same for the op in flight
#      when the links came back; failed ops (goal 0: a failed op ends the
#      stream, which is then restarted and the cuts go on).
#   3. balancer convergence: a stream of 4 MiB ops on 2 rails; after 25 ops
#      rail 1 of every rank (both tbf qdiscs, rank and hub side) changes from R
#      to R/3. Ops from the change until 5 ops in a row are within 5% of the
#      new median (that of the ops after the first 15 that follow the change).
#      Shown beside the times expected with even striping and with shares
#      proportional to the rates.
# Cluster B: 2 rails per rank, rail 0 at S and rail 1 at R (--rates S:R).
#   0. measure.sh
#   1. rail 0 alone, rail 1 alone and both, 4M and 16M (both: after 40 and 32
#      untimed ops, so that the balancer has converged; single rails: 2):
#        both-rail throughput / (rail 0 + rail 1 throughput)  (goal >= 0.9)
# Then the same scenarios through the same balancer in the simulator
# (cohort-sim rails, rails at the rates measure.sh saw): the prediction the
# live figures are compared with.
# About 5-7 minutes. Exit 77 when not root or no cluster can be built; 1 when a
# step could not be run at all (a figure that misses its goal is reported, not
# a failure of the script).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${COHORT_BUILD:-$repo/build}
rate=300 slow=100 cuts=20 out=""
while [ $# -gt 0 ]; do
  case $1 in
  --build) build=$2; shift ;;
  --rate) rate=$2; shift ;;
  --slow) slow=$2; shift ;;
  --cuts) cuts=$2; shift ;;
  --out) out=$2; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "multirail.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "multirail.sh: SKIP: needs root (network namespaces)"; exit 77; }
build=$(cd "$build" && pwd)
for b in cohortrun rails-stream cluster-probe; do
  [ -x "$build/bin/$b" ] || { echo "multirail.sh: no $build/bin/$b (build it)" >&2; exit 1; }
done
out=${out:-/tmp/cohort-multirail.$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
export COHORTRUN=$build/bin/cohortrun COHORT_CLUSTER_PROBE=$build/bin/cluster-probe
exec /usr/bin/python3 - "$repo" "$build" "$out" "$rate" "$slow" "$cuts" <<'PY'
import math, os, random, re, signal, statistics, subprocess, sys, time

repo, build, out = sys.argv[1], sys.argv[2], sys.argv[3]
RATE, SLOW, CUTS = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
CL = os.path.join(repo, "tests/cluster/cluster.sh")
MEASURE = os.path.join(repo, "tests/cluster/measure.sh")
STREAM = os.path.join(build, "bin/rails-stream")
N = 4
MiB = 1 << 20
# Link events: the engine's own lines ("failed over", "is back") or, with the
# reactor's observer, "link to rank P: failover (now via ..." / ": return (".
FO = r"link to rank [0-9]+ failed over|: failover \("
BACK = r"link to rank [0-9]+ is back|: return \("
T0 = time.monotonic()
made = []


def fmt_rate(r):
    return ("%g" % r)


def on_signal(sig, frame):
    raise SystemExit(128 + sig)


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGHUP, on_signal)


def say(*a):
    print("[%5.0fs]" % (time.monotonic() - T0), *a, flush=True)


def sh(*cmd, check=True, quiet=False):
    r = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: status %d\n%s" % (" ".join(cmd), r.returncode, r.stdout[-3000:]))
    return r


def up(name, rates):
    say("cluster %s: 4 ranks x 2 rails, --rates %s" % (name, rates))
    r = subprocess.run([CL, "up", name, str(N), "--nics", "2", "--rates", rates],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode == 77:
        print(r.stdout)
        sys.exit(77)
    made.append(name)
    if r.returncode != 0:
        raise RuntimeError("cluster.sh up %s failed:\n%s" % (name, r.stdout))
    env = {}
    for line in sh(CL, "env", name).stdout.splitlines():
        m = re.match(r"^(COH_\w+)=(.*)$", line)
        if m:
            env[m.group(1)] = m.group(2).strip("'\"")
    return env


def down(name):
    subprocess.run([CL, "down", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if name in made:
        made.remove(name)


def measure(name, tag):
    say("measure.sh %s (one TCP stream at a time, 1 s each)" % name)
    r = sh(MEASURE, name, "-t", "1", "--csv", check=False)
    open(os.path.join(out, "measure-%s.csv" % tag), "w").write(r.stdout)
    rows = []
    for line in r.stdout.splitlines()[1:]:
        f = line.split(",")
        if len(f) == 6:
            try:
                rows.append((f[1], f[2], float(f[3]), float(f[4])))
            except ValueError:
                pass
    return rows


class Run:
    """One rails-stream run under cluster.sh run: its per-op lines, sizes and log."""

    def __init__(self, name, nics, args, tag, timeout=150):
        self.tag = tag
        self.log = os.path.join(out, "%s.log" % tag)
        self.stop = os.path.join(out, "%s.stop" % tag)
        if os.path.exists(self.stop):
            os.unlink(self.stop)
        self.f = open(self.log, "w")
        self.p = subprocess.Popen([CL, "run", name, "--nics", nics, "--timeout", str(timeout), "--",
                                   STREAM, "--csv"] + args, stdout=self.f, stderr=subprocess.STDOUT)

    def text(self):
        return open(self.log, errors="replace").read()

    def count(self, what):
        return len(re.findall(what, self.text()))

    def ops(self):
        res = []
        for line in self.text().splitlines():
            if line.startswith("[0] op,"):
                f = line[4:].split(",")
                res.append((int(f[1]), int(f[2]), float(f[3]), float(f[4]), float(f[5])))
        return res

    def sizes(self):
        res = {}
        for line in self.text().splitlines():
            if line.startswith("[0] size,"):
                f = line[4:].split(",")
                res[int(f[1])] = float(f[3])
        return res

    def wait(self):
        rc = self.p.wait()
        self.f.close()
        return rc

    def failures(self):
        return [l for l in self.text().splitlines() if "FAIL" in l or "WRONG" in l]


def run_sizes(name, nics, sizes, ops, tag, warmup="2"):
    r = Run(name, nics, ["--bytes", ",".join(sizes), "--ops", ",".join(map(str, ops)),
                         "--warmup", warmup], tag)
    rc = r.wait()
    if rc != 0:
        say("  %s FAILED (status %d): %s" % (tag, rc, " | ".join(r.failures()[-2:])))
        return None
    return r.sizes()


def set_rail_rate(env, k, mbit):
    """tc qdisc change of rail k on every rank (its eth<k>) and hub port (r<i>-<k>)."""
    burst = env.get("COH_BURST", "128k")
    lat = env.get("COH_LATENCY", "20ms")
    for i in range(N):
        for ns, dev in (("%s-%d" % (env["COH_NAME"], i), "eth%d" % k), (env["COH_HUB"], "r%d-%d" % (i, k))):
            sh("tc", "-n", ns, "qdisc", "change", "dev", dev, "root", "tbf", "rate", "%gmbit" % mbit,
               "burst", burst, "latency", lat)


def nearest_rank(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(p * len(s)) - 1))]


def in_flight(ops, t):
    """The op running at time t (or the next one to start)."""
    for o in ops:
        if o[2] <= t < o[3]:
            return o
    later = [o for o in ops if o[2] >= t]
    return later[0] if later else None


summary = []  # (figure, measured, goal, verdict)


def row(fig, val, goal="", ok=None):
    summary.append((fig, val, goal, "" if ok is None else ("ok" if ok else "MISSED")))


SMALL = ["4K", "16K", "64K"]
LARGE = ["4M", "16M"]
LB_EPOCH = int(os.environ.get("COHORT_LB_EPOCH", "16"))
SZ = {"4K": 4096, "16K": 16384, "64K": 65536, "4M": 4 * MiB, "16M": 16 * MiB}
status = 0
try:
    # ------------------------------------------------------------ cluster A
    A = "mra%d" % os.getpid()
    envA = up(A, fmt_rate(RATE))
    mA = measure(A, "A")
    best = {}
    for rnd in (1, 2):
        for nics in ("eth0", "eth1", "eth0,eth1"):
            say("A round %d: --nics %s, %s" % (rnd, nics, ",".join(SMALL + LARGE)))
            res = run_sizes(A, nics, SMALL + LARGE, [300, 300, 300, 8, 5],
                            "A-%s-r%d" % (nics.replace(",", "+"), rnd))
            if res is None:
                status = 1
                continue
            for b, med in res.items():
                key = (nics, b)
                best[key] = min(best.get(key, med), med)
            say("  " + "  ".join("%s %.2f ms" % (s, res.get(SZ[s], float("nan"))) for s in SMALL + LARGE))

    def t(nics, s):
        return best.get((nics, SZ[s]))

    for s in LARGE:
        one = [t(n, s) for n in ("eth0", "eth1") if t(n, s)]
        two = t("eth0,eth1", s)
        if one and two:
            ratio = min(one) / two
            row("A: 2 rails / 1 rail throughput, %s" % s,
                "%.2fx (1 rail %.1f MB/s, 2 rails %.1f MB/s)" % (ratio, SZ[s] / min(one) / 1e3,
                                                                   SZ[s] / two / 1e3),
                ">= 1.85x", ratio >= 1.85)
        else:
            row("A: 2 rails / 1 rail throughput, %s" % s, "not measured (a run failed)", ">= 1.85x", False)
    for s in SMALL:
        one = [t(n, s) for n in ("eth0", "eth1") if t(n, s)]
        two = t("eth0,eth1", s)
        if one and two:
            ratio = two / min(one)
            row("A: 2-rail / best 1-rail time, %s" % s,
                "%.3fx (%.3f vs %.3f ms)" % (ratio, two, min(one)), "<= 1.05x", ratio <= 1.05)
        else:
            row("A: 2-rail / best 1-rail time, %s" % s, "not measured (a run failed)", "<= 1.05x", False)

    # Nezha's virtual multi-rail: two rails on one interface (eth0 twice). On
    # a shaped link they share its rate: no gain is expected, only the cost
    # of the second rail's bookkeeping.
    say("A: --nics eth0,eth0 (2 rails on one interface), 4M")
    res = run_sizes(A, "eth0,eth0", ["4M"], [8], "A-eth0+eth0")
    if res and t("eth0", "4M") and res.get(SZ["4M"]):
        v = res[SZ["4M"]]
        row("A: 2 rails on one interface / 1 rail throughput, 4M",
            "%.2fx (%.1f vs %.1f ms)" % (t("eth0", "4M") / v, v, t("eth0", "4M")))

    # failover: CUTS cuts of rank 2's eth1, 0.5 s down each
    say("A failover: %d cuts of rank 2's eth1 (0.5 s down) under a 4 MiB stream" % CUTS)
    ns2 = "%s-2" % A
    addr2 = "10.%s.1.3" % envA["COH_SUBNET"]
    cut_log = []  # (t_cut, t_up, t_back or None, run index, failed-over link ends)
    runs, failed_ops, errors, restarts = [], 0, [], 0
    rnd = random.Random(1)

    def start_stream(i):
        r = Run(A, "eth0,eth1", ["--bytes", "4M", "--ops", "100000", "--warmup", "2",
                                 "--stop-file", os.path.join(out, "A-failover-%d.stop" % i)],
                "A-failover-%d" % i, timeout=400)
        r.stop = os.path.join(out, "A-failover-%d.stop" % i)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(r.ops()) < 8 and r.p.poll() is None:
            time.sleep(0.1)
        return r

    cur = start_stream(0)
    runs.append(cur)
    base = statistics.median([o[4] for o in cur.ops()[2:8]] or [float("nan")])
    say("  2-rail op time before the cuts: %.1f ms" % base)
    recover = []  # link up -> 3 ops in a row at <= 1.2x the 2-rail time
    done = 0
    while done < CUTS:
        if cur.p.poll() is not None:
            cur.wait()
            failed_ops += 1
            errors.append(" | ".join(cur.failures()[-1:]) or "the stream ended (status %d)" % cur.p.returncode)
            say("  the stream FAILED: %s; restarting it" % errors[-1])
            restarts += 1
            if restarts > CUTS:
                say("  too many failures; giving up on the cuts")
                status = 1
                break
            cur = start_stream(len(runs))
            runs.append(cur)
            continue
        time.sleep(0.3 + 0.5 * rnd.random())  # at a random point of an op
        fo0, back0 = cur.count(FO), cur.count(BACK)
        a = time.monotonic()
        sh("ip", "-n", ns2, "link", "set", "eth1", "down")
        b = time.monotonic()
        tcut = (a + b) / 2
        time.sleep(0.5)
        sh("ip", "-n", ns2, "link", "set", "eth1", "up")
        tup = time.monotonic()
        if addr2 not in sh("ip", "-n", ns2, "-4", "-o", "addr", "show", "dev", "eth1").stdout:
            say("  note: eth1 lost %s on down/up; re-added" % addr2)
            sh("ip", "-n", ns2, "addr", "add", addr2 + "/24", "dev", "eth1")
        # wait (at most 6 s) until every link that failed over is back
        tback = None
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and cur.p.poll() is None:
            fo, back = cur.count(FO), cur.count(BACK)
            if fo > fo0 and back - back0 >= fo - fo0:
                break
            time.sleep(0.05)
        txt = cur.text()
        fo, back = len(re.findall(FO, txt)), len(re.findall(BACK, txt))
        backs = [float(m.group(1)) for m in re.finditer(r"^\[\d\] ([0-9.]+) INFO .*(?:%s)" % BACK, txt, re.M)]
        backs = [x for x in backs if x > tcut]
        if backs and back - back0 >= fo - fo0:
            tback = max(backs)
        # and until rail 1 carries its share again (the balancer takes a rail
        # that failed over out of its table until it is back): 3 ops in a row
        # at <= 1.2x the 2-rail time, so that the next cut hits a busy rail
        trec = None
        deadline = time.monotonic() + 10
        while tback and time.monotonic() < deadline and cur.p.poll() is None:
            recent = [o for o in cur.ops() if o[2] > tup][-3:]
            if len(recent) == 3 and all(o[4] <= 1.2 * base for o in recent):
                trec = recent[0][2]
                break
            time.sleep(0.05)
        if trec:
            recover.append((trec - tup) * 1e3)
        # Before the next cut, let the tables catch up: one published while
        # the rail was out applies for a whole epoch, one epoch ahead, so the
        # rail carries its share again within two epochs of its return. A
        # cut before that would hit an idle rail and measure nothing.
        if tback:
            n0 = len(cur.ops())
            deadline = time.monotonic() + 15
            while (len(cur.ops()) < n0 + 2 * LB_EPOCH and time.monotonic() < deadline and
                   cur.p.poll() is None):
                time.sleep(0.05)
        cut_log.append((tcut, tup, tback, len(runs) - 1, fo - fo0))
        done += 1
        say("  cut %2d: %d link ends failed over, %s, %s" % (done, fo - fo0,
            "back %.0f ms after up" % ((tback - tup) * 1e3) if tback else "NOT all back",
            "2-rail speed %.0f ms after up" % ((trec - tup) * 1e3) if trec else "2-rail speed NOT regained"))
    time.sleep(1)
    open(cur.stop, "w").close()
    if cur.wait() != 0:
        failed_ops += 1
        errors.append(" | ".join(cur.failures()[-1:]) or "the stream ended (status %d)" % cur.p.returncode)
    allops = [o for r in runs for o in r.ops()]
    med = statistics.median([o[4] for o in allops]) if allops else float("nan")
    extra_cut, extra_back, no_fo, no_back = [], [], 0, 0
    with open(os.path.join(out, "A-failover-cuts.csv"), "w") as f:
        f.write("cut,t_cut,t_up,t_back,link_ends_failed_over,cut_op_ms,cut_extra_ms,back_op_ms,back_extra_ms\n")
        for i, (tc, tu, tb, ri, nfo) in enumerate(cut_log):
            ops = runs[ri].ops()
            oc = in_flight(ops, tc)
            ob = in_flight(ops, tb) if tb else None
            if nfo == 0:
                no_fo += 1
            if tb is None:
                no_back += 1
            if oc:
                extra_cut.append(oc[4] - med)
            if ob and ob is not oc:
                extra_back.append(ob[4] - med)
            f.write("%d,%.3f,%.3f,%s,%d,%s,%s,%s,%s\n" % (
                i + 1, tc, tu, "%.3f" % tb if tb else "", nfo,
                "%.1f" % oc[4] if oc else "", "%.1f" % (oc[4] - med) if oc else "",
                "%.1f" % ob[4] if ob else "", "%.1f" % (ob[4] - med) if ob else ""))
    say("  %d ops, median %.1f ms; extra of the op hit by each cut (ms): %s" % (
        len(allops), med, " ".join("%.0f" % x for x in extra_cut)))
    row("A: failover, extra time of the op in flight at a cut",
        "p50 %.0f ms, p99 %.0f ms (%d cuts; op median %.1f ms)" % (
            nearest_rank(extra_cut, 0.5), nearest_rank(extra_cut, 0.99), len(extra_cut), med),
        "p99 <= 200 ms", bool(extra_cut) and nearest_rank(extra_cut, 0.99) <= 200)
    row("A: failover, extra time of the op in flight at the return",
        "p50 %.0f ms, p99 %.0f ms (%d returns)" % (nearest_rank(extra_back, 0.5),
                                                   nearest_rank(extra_back, 0.99), len(extra_back)))
    row("A: failover, link up -> 2-rail op time again (3 ops <= 1.2x)",
        "p50 %.0f ms, p99 %.0f ms (%d of %d cuts)" % (nearest_rank(recover, 0.5), nearest_rank(recover, 0.99),
                                                      len(recover), len(cut_log)))
    row("A: failover, failed ops (stream restarts)", "%d%s" % (failed_ops, ": " + errors[0][:90] if errors else ""),
        "0", failed_ops == 0)
    row("A: failover, cuts without a failover / without a return", "%d / %d of %d" % (no_fo, no_back, len(cut_log)),
        "0 / 0", no_fo == 0 and no_back == 0)

    # convergence after a rate change of rail 1: RATE -> RATE/3
    new = RATE / 3
    say("A convergence: rail 1 %g -> %g Mbit/s after 25 ops of a 4 MiB stream" % (RATE, new))
    r = Run(A, "eth0,eth1", ["--bytes", "4M", "--ops", "100000", "--warmup", "2",
                             "--stop-file", os.path.join(out, "A-converge.stop")], "A-converge", timeout=200)
    r.stop = os.path.join(out, "A-converge.stop")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(r.ops()) < 25 and r.p.poll() is None:
        time.sleep(0.05)
    tchange = time.monotonic()
    set_rail_rate(envA, 1, new)
    tchange = (tchange + time.monotonic()) / 2
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and r.p.poll() is None and \
            len([o for o in r.ops() if o[2] > tchange]) < 60:
        time.sleep(0.1)
    open(r.stop, "w").close()
    rc = r.wait()
    ops = r.ops()
    before = [o[4] for o in ops if o[3] <= tchange]
    after = [o[4] for o in ops if o[2] > tchange]
    if rc != 0 or len(after) < 30 or len(before) < 10:
        row("A: ops to converge after rail 1 %g -> %g" % (RATE, new),
            "not measured (status %d, %d ops after the change)" % (rc, len(after)))
        status = 1
    else:
        old_med = statistics.median(before[3:])
        new_med = statistics.median(after[15:])
        settle = None
        for k in range(len(after) - 4):
            if all(abs(x - new_med) <= 0.05 * new_med for x in after[k:k + 5]):
                settle = k
                break
        # expected times: even striping (each rail half the bytes) vs shares
        # proportional to the rates (the pair delivers RATE + new)
        even = old_med * (RATE / new)
        prop = old_med * (2 * RATE) / (RATE + new)
        with open(os.path.join(out, "A-converge.csv"), "w") as f:
            f.write("op_after_change,ms\n")
            for k, x in enumerate(after):
                f.write("%d,%.3f\n" % (k, x))
        say("  before %.1f ms, after %.1f ms (even striping would give %.1f, proportional %.1f); "
            "first ops after: %s" % (old_med, new_med, even, prop, " ".join("%.0f" % x for x in after[:12])))
        look = "even striping" if abs(new_med - even) < abs(new_med - prop) else "proportional shares"
        row("A: ops to converge after rail 1 %g -> %g" % (RATE, new),
            "%s (median %.1f -> %.1f ms; closer to %s: even %.0f, proportional %.0f ms)" % (
                settle if settle is not None else "never within 5%", old_med, new_med, look, even, prop),
            "sim 7, Nezha<=100")
    down(A)

    # ------------------------------------------------------------ cluster B
    B = "mrb%d" % os.getpid()
    up(B, "%s:%s" % (fmt_rate(SLOW), fmt_rate(RATE)))
    mB = measure(B, "B")
    resB = {}
    # 2 rails: 40 and 32 untimed ops first, so that the balancer (a new table
    # every COHORT_LB_EPOCH ops, per size bucket) has converged: the figure is
    # the steady state; A's convergence figure is the way there.
    for nics, ops, warm in (("eth0", [4, 3], "2"), ("eth1", [8, 5], "2"),
                            ("eth0,eth1", [8, 5], "40,32")):
        say("B: --nics %s (rails %s:%s), 4M,16M, warmup %s" % (nics, fmt_rate(SLOW), fmt_rate(RATE), warm))
        res = run_sizes(B, nics, LARGE, ops, "B-%s" % nics.replace(",", "+"), warm)
        if res is None:
            status = 1
            continue
        resB[nics] = res
        say("  " + "  ".join("%s %.1f ms" % (s, res.get(SZ[s], float("nan"))) for s in LARGE))
    for s in LARGE:
        try:
            thr = {n: SZ[s] / resB[n][SZ[s]] / 1e3 for n in resB}
            ratio = thr["eth0,eth1"] / (thr["eth0"] + thr["eth1"])
            row("B: rails %s:%s, both / (sum of singles), %s" % (fmt_rate(SLOW), fmt_rate(RATE), s),
                "%.2f (%.1f vs %.1f + %.1f MB/s)" % (ratio, thr["eth0,eth1"], thr["eth0"], thr["eth1"]),
                ">= 0.9", ratio >= 0.9)
        except (KeyError, ZeroDivisionError):
            row("B: rails %s:%s, both / (sum of singles), %s" % (fmt_rate(SLOW), fmt_rate(RATE), s),
                "not measured (a run failed)", ">= 0.9", False)
    down(B)

    # ------------------------------------------------------------ summary
    def cap(rows, nic):
        xs = [m for (_, k, c, m) in rows if k == nic]
        cs = [c for (_, k, c, m) in rows if k == nic]
        if not xs:
            return "n/a"
        return "%.0f-%.0f Mbit/s (configured %g; %.3f of it)" % (min(xs), max(xs), cs[0],
                                                                 statistics.median(xs) / cs[0])
    # The same scenarios through the same balancer in the simulator
    # (cohort-sim rails: modelled rails at the rates measure.sh saw).
    SIM = os.path.join(build, "bin/cohort-sim")

    def sim(*args):
        r = subprocess.run([SIM, "rails", "--size", str(4 * MiB), "--ops", "200"] + list(args),
                           capture_output=True, text=True)
        m = re.search(r"mean ([0-9.]+) ms, best single rail ([0-9.]+) ms", r.stdout)
        w = re.search(r"worst extra time ([0-9.]+) ms; ops to converge after the last change: (-?\d+)",
                      r.stdout)
        return (float(m.group(1)), float(m.group(2)), float(w.group(1)), int(w.group(2))) if m and w else None

    if os.access(SIM, os.X_OK):
        def med(rows, nic):
            xs = [m for (_, k, c, m) in rows if k == nic]
            return statistics.median(xs) if xs else None
        a0, b0, b1 = med(mA, "eth0") or RATE, med(mB, "eth0") or SLOW, med(mB, "eth1") or RATE
        two = sim("--rail", "50:%g" % a0, "--rail", "50:%g" % a0)
        onethree = sim("--rail", "50:%g" % b0, "--rail", "50:%g" % b1)
        cut = sim("--rail", "50:%g" % a0, "--rail", "50:%g" % a0, "--cut", "1@100", "--back", "1@110")
        conv = sim("--rail", "50:%g" % a0, "--rail", "50:%g" % a0, "--rate", "1@25:%g" % (a0 / 3))
        if two and onethree and cut and conv:
            row("prediction (cohort-sim rails, measured rates): A 4M 2 rails / 1 rail",
                "%.2fx (%.1f vs %.1f ms)" % (two[1] / two[0], two[0], two[1]))
            row("prediction: B 4M both / (sum of singles)",
                "%.2f (%.1f ms)" % ((onethree[1] / onethree[0]) * b1 / (b0 + b1), onethree[0]))
            row("prediction: failover, extra time of the op hit (100 ms detection)",
                "%.0f ms" % cut[2])
            row("prediction: ops to converge after rail 1 -> 1/3", "%d" % conv[3])
    summary.insert(0, ("raw links A eth0 / eth1 (measure.sh, up and down)",
                       "%s / %s" % (cap(mA, "eth0"), cap(mA, "eth1")), "", ""))
    summary.insert(1, ("raw links B eth0 / eth1", "%s / %s" % (cap(mB, "eth0"), cap(mB, "eth1")), "", ""))
finally:
    for n in list(made):
        down(n)

lines = ["", "=== multi-rail summary: 4 ranks, f32 sum allreduce, every result checked; "
         "%s; %.0f s ===" % (time.strftime("%Y-%m-%d %H:%M"), time.monotonic() - T0)]
w = max(len(s[0]) for s in summary)
lines.append("%-*s  %-14s %-6s %s" % (w, "figure", "goal", "", "measured"))
for fig, val, goal, ok in summary:
    lines.append("%-*s  %-14s %-6s %s" % (w, fig, goal, ok, val))
lines.append("logs, per-op CSVs: %s" % out)
txt = "\n".join(lines)
print(txt, flush=True)
open(os.path.join(out, "summary.txt"), "w").write(txt + "\n")
sys.exit(status)
PY
