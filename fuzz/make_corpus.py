#!/usr/bin/python3
"""Write the seed corpora of the fuzz targets (fuzz/corpus/<target>/).

Run from anywhere with Debian's python3 (needs python3-msgpack):
    /usr/bin/python3 fuzz/make_corpus.py
Seeds are a few valid inputs of every kind and the boundary cases next to
them. Inputs found by fuzzing that crashed are kept beside them as
crash-<what> files (regressions) and are never regenerated.
"""
import os
import struct

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def ffi():
    t = "ffi_request_fuzzer"
    p = msgpack.packb
    addr = {"addr": 0x7F0000001000, "nbytes": 16}
    reqs = {
        "allreduce_addr": {"v": 1, "type": "allreduce", "dtype": "f32", "op": "sum", "buf": addr,
                           "id": 1},
        "allreduce_inline": {"type": "allreduce", "dtype": "i32", "op": "max",
                             "buf": b"\x01\x00\x00\x00\xff\xff\xff\xff"},
        "allreduce_send_recv": {"type": "allreduce", "dtype": "float64", "send": b"\x00" * 16,
                                "recv": addr, "async": True, "count": 2},
        "allreduce_send_only": {"type": "allreduce", "dtype": "bf16", "op": "avg",
                                "send": b"\x80\x3f" * 3, "recv": None},
        "broadcast": {"type": "broadcast", "dtype": "u8", "root": 1, "buf": b"abc",
                      "timeout_ms": 100},
        "allgather_send": {"type": "allgather", "dtype": "f16", "send": b"\x00\x3c"},
        "allgather_inplace": {"type": "allgather", "dtype": "i64", "recv": b"\x00" * 48},
        "reduce_scatter": {"type": "reduce_scatter", "dtype": "i64", "op": "prod",
                           "send": b"\x01" * 48, "recv": b"\x00" * 16},
        "reduce_scatter_inplace": {"type": "reduce_scatter", "dtype": "float32",
                                   "recv": {"addr": 4096, "nbytes": 24}},
        "barrier": {"type": "barrier", "timeout_ms": -1, "async": False},
        "sync": {"type": "sync", "dtype": "f32", "buf": addr, "iteration": 12, "weight": 0.5,
                 "mode": "selective"},
        "sync_int_weight": {"type": "sync", "dtype": "f32", "buf": b"", "iteration": 0,
                            "weight": 3, "mode": "partial"},
        "sync_relay": {"type": "sync", "dtype": "f64", "buf": b"\x00" * 16, "iteration": 3,
                       "weight": 2.0, "mode": "relay", "async": True},
        "allreduce_relay": {"type": "allreduce", "dtype": "i32", "op": "sum", "algo": "relay",
                            "iteration": 5, "buf": b"\x01\x00\x00\x00\x02\x00\x00\x00"},
        "allreduce_relay_send": {"type": "allreduce", "dtype": "f32", "op": "avg",
                                 "algo": "relay", "send": addr, "recv": None},
        "allreduce_algo_default": {"type": "allreduce", "dtype": "u8", "algo": "default",
                                   "buf": b"abcd"},
        "allreduce_algo_bad": {"type": "allreduce", "dtype": "f32", "algo": "ring", "buf": addr},
        "allreduce_loss": {"type": "allreduce", "dtype": "f32", "op": "avg", "loss_bound": 0.01,
                           "pull_loss_bound": 0.002, "layer": 3, "nlayers": 12, "buf": addr},
        "allreduce_loss_bad": {"type": "allreduce", "dtype": "f32", "loss_bound": 1.5,
                               "layer": 4, "buf": addr},
        "info": {"type": "info", "id": -7},
        "stats": {"type": "stats"},
        "event_clear": {"type": "event_clear", "v": 1},
        "logs": {"type": "logs", "id": 2**63 - 1},
        "failed_ranks": {"type": "failed_ranks"},
        "probe": {"type": "probe", "id": 3},
        "allreduce_device": {"type": "allreduce", "dtype": "f32", "mem": "device",
                             "stream": 2**63, "buf": addr},
        "broadcast_device_inline": {"type": "broadcast", "dtype": "u8", "mem": "device",
                                    "buf": b"abcd"},
        "stream_wait": {"type": "stream_wait", "request": 2**32 + 1, "stream": 7},
        # boundary and bad
        "empty_map": {},
        "unknown_field": {"type": "info", "dtpye": "f32"},
        "wrong_types": {"type": 3, "dtype": 1.5, "buf": "x", "async": "yes"},
        "v2": {"v": 2, "type": "info"},
        "negative_count": {"type": "allreduce", "dtype": "f32", "buf": addr, "count": -1},
        "null_addr": {"type": "allreduce", "dtype": "f32", "buf": {"addr": 0, "nbytes": 8}},
        "huge_addr": {"type": "allreduce", "dtype": "f32",
                      "buf": {"addr": 2**64 - 8, "nbytes": 2**63}},
        "misaligned": {"type": "allreduce", "dtype": "f64", "buf": b"\x00" * 12},
        "config": {"rank": 0, "world_size": 2, "store": "127.0.0.1:29500", "token": "t",
                   "nics": "lo,lo", "timeout_ms": 1000, "connect_timeout_ms": 2000,
                   "chunk_bytes": "1M", "small_bytes": 65536, "rail_min_bytes": "0",
                   "spin_us": 0, "store_fd": -1, "sockbuf_bytes": 0, "poll_us": 50,
                   "log_level": "debug"},
        "config_bad": {"rank": 3, "world_size": 2, "log_level": 9, "chunk_bytes": "1Q"},
    }
    for name, r in reqs.items():
        write(t, name + ".mp", p(r))
    full = p(reqs["allreduce_send_recv"])
    write(t, "truncated.mp", full[: len(full) // 2])
    write(t, "trailing.mp", full + b"\xc0")
    write(t, "array_2e32.mp", b"\xdd\xff\xff\xff\xff")
    write(t, "map_2e32.mp", b"\xdf\xff\xff\xff\xff")
    write(t, "str32_past_end.mp", b"\x81\xa4type\xdb\xff\xff\xff\xf0ab")
    write(t, "reserved_c1.mp", b"\x81\xa4type\xc1")
    write(t, "deep.mp", b"\x91" * 40 + b"\x01")
    write(t, "ext.mp", p({"type": msgpack.ExtType(5, b"abc")}))
    write(t, "dup_key.mp", b"\x82\xa4type\xa4info\xa4type\xa5stats")


def hdr(typ, comm=0, tag=0, seq=0, sig=0, off=0, ln=0, flags=0, magic=b"COHF"):
    return magic + struct.pack("<BBHIIQQQQ", typ, flags, 0, comm, tag, seq, sig, off, ln)


def frame():
    t = "frame_fuzzer"
    write(t, "data", hdr(1, 1, 7, 42, 0xDEADBEEF, 0, 8) + b"payload!")
    write(t, "abort", hdr(2, 0, 0, 3, 0, 0, 9) + struct.pack("<i", -5) + b"lost")
    write(t, "bye", hdr(3))
    write(t, "ack", hdr(4, off=123456))
    write(t, "ack_with_len", hdr(4, off=1, ln=1))
    write(t, "stream", hdr(1, ln=4) + b"abcd" + hdr(1, seq=1, ln=2) + b"ef" + hdr(3))
    write(t, "bad_magic", hdr(1, magic=b"COHX"))
    write(t, "bad_flags", hdr(1, flags=1))
    write(t, "bad_type", hdr(9))
    write(t, "abort_too_long", hdr(2, ln=100000))
    write(t, "data_huge_len", hdr(1, ln=2**62))
    write(t, "prefix", hdr(1)[:20])


def hello(kind=1, rank=0, world=2, rail=0, nrails=1, token=b"", version=2, magic=b"COHH",
          flags=0, via=0, resume_off=0, epoch=0):
    return magic + struct.pack("<HHIIII", version, kind, rank, world, rail, nrails) + \
        token.ljust(64, b"\0") + struct.pack("<IIQQ", flags, via, resume_off, epoch)


def hellos():
    t = "hello_fuzzer"
    # byte 0: length of the expected token; then the token; then the HELLO.
    write(t, "data_ok", b"\x05" + b"sekret"[:5] + hello(token=b"sekre"))
    write(t, "data_wrong_token", b"\x05secre" + hello(token=b"sekre"))
    write(t, "store_no_token", b"\x00" + hello(kind=2, rank=3, world=4))
    write(t, "ctrl_64", b"\x40" + b"k" * 64 + hello(kind=3, token=b"k" * 64))
    write(t, "bad_version", b"\x00" + hello(version=1))
    write(t, "resume", b"\x00" + hello(rank=1, nrails=2, flags=1, via=1, resume_off=4096, epoch=3))
    write(t, "bad_flags", b"\x00" + hello(flags=6))
    write(t, "rank_ge_world", b"\x00" + hello(rank=2, world=2))
    write(t, "zero_world", b"\x00" + hello(world=0))
    write(t, "bad_kind", b"\x00" + hello(kind=7))
    write(t, "prefix", b"\x00" + hello()[:30])
    write(t, "bad_magic", b"\x00" + hello(magic=b"COHF"))


def store_msg(typ, status=0, arg=0, key=b"", val=b"", magic=b"COHS"):
    return magic + struct.pack("<BBHII", typ, status, len(key), len(val), arg) + key + val


def store():
    t = "store_fuzzer"
    write(t, "set", store_msg(1, key=b"addr/0/0", val=b"127.0.0.1:4000"))
    write(t, "get", store_msg(2, key=b"ctrl"))
    write(t, "wait", store_msg(3, arg=5000, key=b"joined"))
    write(t, "add", store_msg(4, arg=1, key=b"joined"))
    write(t, "resp_ok", store_msg(0x80, 0, key=b"", val=b"3"))
    write(t, "resp_notfound", store_msg(0x80, 1))
    write(t, "stream", store_msg(1, key=b"a", val=b"b") + store_msg(2, key=b"a") +
          store_msg(0x80, 2))
    write(t, "key_too_long", store_msg(1, key=b"k" * 600))
    write(t, "get_with_value", store_msg(2, key=b"k", val=b"v"))
    write(t, "req_status", store_msg(1, status=1, key=b"k"))
    write(t, "empty_key", store_msg(1))
    write(t, "prefix", store_msg(1, key=b"abc", val=b"def")[:18])


def ctl_msg(typ, payload, comm=0, magic=b"COHC"):
    return magic + struct.pack("<BBHII", typ, 0, 0, len(payload), comm) + payload


def ctl():
    t = "ctl_fuzzer"
    none = 0xffffffff  # READY.join: no segment of phase 1
    ready = struct.pack("<IIQQIIddQQII", 3, 2, 17, 1 << 20, 0, 0, 0.42, 1.0, 5, 12, none, 0)
    plan = struct.pack("<QQiIdII", 7, 5, 0, 0, 3.0, 3, 0) + struct.pack("<3I", 2, 0, 1)
    plan_err = struct.pack("<QQiIdII", 8, 6, -6, 0, 0.0, 1, 0) + struct.pack("<I", 3)
    done = struct.pack("<QIidII", 7, 3, 0, 0.125, 2, 0) + \
        struct.pack("<IIQd", 0, 0, 1 << 20, 0.01) + struct.pack("<IIQd", 1, 0, 1 << 20, 0.02)
    refuse = struct.pack("<QQII", 7, 5, 1, 3)
    write(t, "ready", ctl_msg(1, ready))
    write(t, "plan", ctl_msg(2, plan))
    write(t, "plan_error", ctl_msg(2, plan_err))
    write(t, "done", ctl_msg(3, done))
    write(t, "refuse", ctl_msg(4, refuse))
    write(t, "leave", ctl_msg(5, struct.pack("<I", 2)))
    write(t, "stream", ctl_msg(1, ready) + ctl_msg(2, plan) + ctl_msg(3, done))
    write(t, "ready_nan_weight", ctl_msg(1, struct.pack("<IIQQIIddQQII", 3, 2, 17, 4, 0, 0, 0.1,
                                                         float("nan"), 5, 0, none, 0)))
    write(t, "plan_short", ctl_msg(2, plan[:-2]))
    write(t, "done_too_many", ctl_msg(3, struct.pack("<QIidII", 7, 3, 0, 0.1, 65, 0)))
    write(t, "unknown_type", ctl_msg(99, b""))
    table = b"CLB1" + struct.pack("<BBHdddII", 2, 0, 3, 5.0, 0.3, 20e-6, 64, 2) + \
        struct.pack("<BBHId", 0, 255, 0, 3, 20e-6) + struct.pack("<BBHId", 1, 20, 0, 7, 1e9)
    write(t, "lbtab", ctl_msg(8, struct.pack("<QII", 3, len(table), 0) + table))
    write(t, "lbtab_len_mismatch", ctl_msg(8, struct.pack("<QII", 3, len(table) + 1, 0) + table))
    write(t, "rail", ctl_msg(9, struct.pack("<IIII", 1, 0, 2, 1)))
    write(t, "rail_bad_kind", ctl_msg(9, struct.pack("<IIII", 1, 0, 2, 7)))
    write(t, "prefix", ctl_msg(1, ready)[:20])
    # a plain relay allreduce's READY (op MIN), relay plans of both phases
    write(t, "ready_relay", ctl_msg(1, struct.pack("<IIQQIIddQQII", 3, 3, 17, 64, 4, 2 | 1 << 8,
                                                    0.1, 1.0, 9, 40, none, 0)))
    # a late rank whose data joined phase 1 at segment 3, and one past the limit
    write(t, "ready_join", ctl_msg(1, struct.pack("<IIQQIIddQQII", 3, 3, 17, 64, 4, 0, 0.1, 1.0,
                                                   9, 40, 3, 0)))
    write(t, "ready_join_bad", ctl_msg(1, struct.pack("<IIQQIIddQQII", 3, 3, 17, 64, 4, 0, 0.1,
                                                       1.0, 9, 40, 64, 0)))
    rplan1 = struct.pack("<QQIIQIIiIdIIIIQ", 7, 0, 1, 0, 64, 0, 0, -3, 0, 2.0, 4, 1, 4, 0, 0) + \
        struct.pack("<5I", 0, 2, 1, 3, 3)
    rplan2 = struct.pack("<QQIIQIIiIdIIIIQ", 7, 9, 2, 1, 64, 0, 0, -3, 1, 4.0, 4, 1, 1, 0, 48) + \
        struct.pack("<5I", 0, 2, 1, 3, 3)
    write(t, "rplan2_prefix_past_count", ctl_msg(10, rplan2[:72] + struct.pack("<Q", 65) +
                                                  rplan2[80:]))
    write(t, "rplan1", ctl_msg(10, rplan1))
    write(t, "rplan2", ctl_msg(10, rplan2))
    write(t, "rplan_bad_phase", ctl_msg(10, rplan1[:16] + struct.pack("<I", 3) + rplan1[20:]))
    write(t, "rplan_short", ctl_msg(10, rplan1[:-4]))
    write(t, "lost", ctl_msg(7, struct.pack("<III", 2, 0, 3)))
    write(t, "lost_bad_why", ctl_msg(7, struct.pack("<III", 2, 0, 9)))
    write(t, "bye", ctl_msg(11, struct.pack("<I", 1)))
    write(t, "shrink", ctl_msg(12, struct.pack("<IIII", 1, 0, 0, 3) + struct.pack("<3I", 0, 1, 3)))
    write(t, "shrunk", ctl_msg(13, struct.pack("<IIiI", 0, 1, 0, 2) + struct.pack("<2I", 1, 3)))
    write(t, "shrunk_error", ctl_msg(13, struct.pack("<IIiI", 0, 0, -6, 0)))
    write(t, "shrunk_bad_status", ctl_msg(13, struct.pack("<IIiI", 0, 0, 4, 0)))
    write(t, "probe", ctl_msg(14, struct.pack("<II", 1, 2) + struct.pack("<IIdd", 0, 0, 20e-6, 9.5) +
                              struct.pack("<IIdd", 2, 1, 31e-6, 0.39)))
    write(t, "probe_bad_rail", ctl_msg(14, struct.pack("<II", 1, 1) +
                                       struct.pack("<IIdd", 0, 99, 20e-6, 9.5)))
    write(t, "commit", ctl_msg(15, struct.pack("<QiI", 41, 0, 0)))
    write(t, "commit_again", ctl_msg(15, struct.pack("<QiI", 41, -6, 0)))
    write(t, "commit_bad_status", ctl_msg(15, struct.pack("<QiI", 41, 2, 0)))
    write(t, "state", ctl_msg(16, struct.pack("<IIQQ", 2, 0, 40, 41)))
    write(t, "grow", ctl_msg(17, struct.pack("<IIII", 1, 3, 3, 2) + struct.pack("<2I", 0, 1)))
    write(t, "grow_rejoin", ctl_msg(17, struct.pack("<IIII", 2, 0, 0, 0)))
    write(t, "state_short", ctl_msg(16, struct.pack("<IIQ", 2, 0, 40)))


def dg(flags=0, job=0x334455667788, comm=0, step=1, seq=3, segno=0, seg=1400, payload=b"",
       version=3):
    """A datagram of the bounded-loss transport (version 3: a 24-byte header, offset and
    length implied), then the segment size (2 bytes, big-endian) the fuzzer decodes it with."""
    u48 = lambda v: struct.pack("<Q", v)[:6]
    u24 = lambda v: struct.pack("<I", v)[:3]
    head = (struct.pack("<BB", version, flags) + u48(job) + struct.pack("<I", comm) + u48(seq) +
            u24(step) + u24(segno))
    return head + payload + struct.pack(">H", seg)


def dgram():
    t = "dgram_fuzzer"
    write(t, "first", dg(payload=bytes(range(200))))
    write(t, "pull_last", dg(flags=3, segno=5, seg=256, payload=b"\x01" * 256))
    write(t, "short_last", dg(segno=63, seg=64, payload=b"xy"))
    write(t, "past_bitmap", dg(segno=64, seg=64, payload=b"z"))
    write(t, "empty", dg())
    write(t, "too_long", dg(seg=16, payload=b"a" * 17))
    write(t, "bad_version", dg(version=2))
    write(t, "bad_flags", dg(flags=0x80))
    write(t, "no_segment_size", dg(seg=0, payload=b"q"))
    # a rate report (EN_DG_RATE): u64 bytes, u64 ns
    write(t, "rate", dg(flags=4, payload=struct.pack("<QQ", 123456, 1000000)))


if __name__ == "__main__":
    dgram()
    ffi()
    frame()
    hellos()
    store()
    ctl()
    print("corpora written under", os.path.join(HERE, "corpus"))
