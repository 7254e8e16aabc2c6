#!/usr/bin/env python3
"""Merge the per-rank timelines of a run (COHORT_TIMELINE) into one Chrome
trace on rank 0's clock, and check them.

    /usr/bin/python3 tools/cohort_timeline.py [--check] OUT.json tl.0.json tl.1.json ...

Each rank's file keeps its own clock; its otherData.clock_offset_us (this
rank's clock minus rank 0's, measured at bootstrap) is subtracted from its
timestamps, the ranks become processes (pid = rank) and the events are
merged in time order. Open OUT.json in chrome://tracing or ui.perfetto.dev.

--check verifies every file: valid JSON; events in time order; every async
begin ('b') has its end ('e') with the same id, not before it, and a
request's slices lie inside it; complete events ('X') of one thread nest
(never overlap partly); one request per request the library counted
(otherData.requests). Exits 1 listing what is wrong.
"""
import json
import sys


def check(path, doc):
    errs = []
    ev = doc.get("traceEvents")
    od = doc.get("otherData", {})
    if not isinstance(ev, list):
        return ["%s: no traceEvents list" % path]
    last = None
    opened = {}  # (cat, id) -> stack of (name, ts)
    requests = 0
    stacks = {}  # tid -> stack of end times of X events
    for i, e in enumerate(ev):
        ph = e.get("ph")
        if ph == "M":
            continue
        for k in ("ts", "pid", "tid", "name"):
            if k not in e:
                errs.append("%s: event %d has no %s" % (path, i, k))
        ts = e.get("ts", 0.0)
        if last is not None and ts < last:
            errs.append("%s: event %d (%s) at %.3f before the one ahead of it (%.3f)" % (
                path, i, e.get("name"), ts, last))
        last = ts
        if ph in ("b", "e"):
            key = (e.get("cat"), e.get("id"))
            st = opened.setdefault(key, [])
            if ph == "b":
                if e.get("name") != "slice":
                    requests += 1
                    if st:
                        errs.append("%s: request id %s begins twice" % (path, key[1]))
                elif not st:
                    errs.append("%s: a slice of id %s outside its request" % (path, key[1]))
                st.append((e.get("name"), ts))
            else:
                if not st or st[-1][0] != e.get("name"):
                    errs.append("%s: event %d ends %s of id %s, which is not open (innermost)" % (
                        path, i, e.get("name"), key[1]))
                else:
                    name, t0 = st.pop()
                    if ts < t0:
                        errs.append("%s: %s of id %s ends before it begins" % (path, name, key[1]))
        elif ph == "X":
            end = ts + e.get("dur", 0.0)
            st = stacks.setdefault(e.get("tid"), [])
            while st and st[-1] <= ts + 1e-3:  # adjacent (rounding of 1 ns)
                st.pop()
            if st and end > st[-1] + 1e-3:
                errs.append("%s: %s on thread %s (%.3f-%.3f) overlaps the one it starts in" % (
                    path, e.get("name"), e.get("tid"), ts, end))
            st.append(end)
    for key, st in opened.items():
        if st:
            errs.append("%s: id %s never ends (%s)" % (path, key[1], st[-1][0]))
    if od.get("dropped"):
        errs.append("%s: %d events dropped (the buffer was full)" % (path, od["dropped"]))
    if "requests" in od and od["requests"] != requests:
        errs.append("%s: %d requests in the trace, the library counted %d" % (
            path, requests, od["requests"]))
    return errs


def main():
    args = sys.argv[1:]
    do_check = "--check" in args
    args = [a for a in args if a != "--check"]
    if len(args) < 2:
        print(__doc__)
        return 2
    out, paths = args[0], args[1:]
    merged, errs, summary = [], [], []
    for p in paths:
        try:
            with open(p) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            errs.append("%s: %s" % (p, e))
            continue
        if do_check:
            errs += check(p, doc)
        od = doc.get("otherData", {})
        off = float(od.get("clock_offset_us", 0.0))
        for e in doc.get("traceEvents", []):
            if "ts" in e:
                e = dict(e, ts=e["ts"] - off)
            merged.append(e)
        summary.append("rank %s: %d events, %d requests, clock offset %.1f us (spread %.1f us "
                       "over %d rounds)" % (od.get("rank"), od.get("events", 0),
                                            od.get("requests", 0), off,
                                            od.get("offset_spread_us", 0.0),
                                            od.get("offset_rounds", 0)))
    meta = [e for e in merged if e.get("ph") == "M"]
    rest = sorted((e for e in merged if e.get("ph") != "M"), key=lambda e: e["ts"])
    if rest:  # start the merged trace at 0
        t0 = rest[0]["ts"]
        rest = [dict(e, ts=round(e["ts"] - t0, 3)) for e in rest]
    with open(out, "w") as f:
        json.dump({"displayTimeUnit": "ms", "traceEvents": meta + rest}, f)
    for line in summary:
        print(line)
    print("merged %d events of %d ranks into %s" % (len(rest), len(summary), out))
    if errs:
        for e in errs[:50]:
            print("CHECK FAILED: " + e)
        if len(errs) > 50:
            print("... and %d more" % (len(errs) - 50))
        return 1
    if do_check:
        print("check: every file valid, ordered, nested, every request present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
