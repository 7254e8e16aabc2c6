/*
 * rx_config.h - every knob of a context, written once.
 *
 * RX_CONFIG_MAP is the one table of coh_config_t's fields: from it come the
 * defaults and the environment parsing of coh_config_init, the validation
 * of coh_init (rx_config_validate), the config fields of the msgpack ABI
 * (ffi/ff_codec.c), `cohortrun --knobs` and the README's knob table (checked
 * against it by the docs.knobs test). RX_ENV_MAP holds the knobs that exist
 * only as environment variables. Scheduler parameters have their own table
 * (SC_PARAM_MAP in sched/sched.h): COHORT_SCHED and COHORT_SCHED_<NAME>.
 *
 * Columns: field, kind, default (as text, parsed like the environment),
 * environment variable, lowest and highest value (for strings: length), and
 * a line of help. Sizes take K, M, G suffixes (powers of two).
 */
#ifndef COH_RX_CONFIG_H
#define COH_RX_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort.h"

#define RX_MAX_WORLD (1 << 20)
#define RX_STR_MAX   4095

typedef enum rx_knob_kind {
    RX_K_INT = 0, /* int */
    RX_K_SIZE,    /* size_t, with K/M/G */
    RX_K_STR,     /* const char * (length bounds) */
    RX_K_MODE,    /* int: a coh_sync_mode by name */
} rx_knob_kind;

/* X(field, kind, default, env, lo, hi, help) */
#define RX_CONFIG_MAP(X)                                                                           \
    X(rank, RX_K_INT, "0", "COHORT_RANK", 0, RX_MAX_WORLD - 1,                                     \
      "this rank; else RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID")                      \
    X(world_size, RX_K_INT, "1", "COHORT_WORLD_SIZE", 1, RX_MAX_WORLD,                             \
      "the number of ranks; else WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS")      \
    X(store, RX_K_STR, "", "COHORT_STORE", 0, 1024,                                                \
      "host:port of rank 0's bootstrap store; else MASTER_ADDR:(MASTER_PORT + "                    \
      "COHORT_STORE_PORT_OFFSET)")                                                                 \
    X(token, RX_K_STR, "", "COHORT_TOKEN", 0, 64,                                                  \
      "job token every connection must present (at most 64 bytes)")                                \
    X(nics, RX_K_STR, "lo", "COHORT_NICS", 1, RX_STR_MAX,                                          \
      "comma list of interfaces or addresses, one rail (reactor) each; every rank needs the "      \
      "same count; NIC:verbs an RDMA rail (NIC may name the RDMA device: mlx5_0:verbs; "           \
      "docs/verbs.md); NIC:udp makes a rail bounded-loss capable (ops with a loss bound send "     \
      "their data there as datagrams; docs/udp.md), NIC:udp@MBPS also gives its line rate")        \
    X(timeout_ms, RX_K_INT, "300000", "COHORT_TIMEOUT_MS", 1, INT_MAX,                             \
      "an op fails after this long without progress (5 min: a rank may be writing a checkpoint; "  \
      "a dead peer fails it at once through its connection, a hung one after COHORT_LIVENESS_MS)") \
    X(connect_timeout_ms, RX_K_INT, "60000", "COHORT_CONNECT_TIMEOUT_MS", 1, INT_MAX,              \
      "deadline for bootstrap (store and every peer connected)")                                   \
    X(chunk_bytes, RX_K_SIZE, "1M", "COHORT_CHUNK_BYTES", 1, SIZE_MAX,                             \
      "pipeline chunk of ring and chain plans")                                                    \
    X(small_bytes, RX_K_SIZE, "64K", "COHORT_SMALL_BYTES", 0, SIZE_MAX,                            \
      "at or below this total size, latency-optimal plans (recursive doubling, tree, direct)")     \
    X(rail_min_bytes, RX_K_SIZE, "1M", "COHORT_RAIL_MIN_BYTES", 0, SIZE_MAX,                       \
      "smaller ops use one rail (chosen by the op's sequence), larger ones are striped over all")  \
    X(spin_us, RX_K_INT, "-1", "COHORT_SPIN_US", -1, 1000000,                                      \
      "coh_wait runs the request's rail loops itself this long before sleeping (yielding the CPU " \
      "after each pass that moved nothing when there are more local ranks than cores); -1: 5000")  \
    X(store_fd, RX_K_INT, "-1", "COHORT_STORE_FD", -1, INT_MAX,                                    \
      "a listening socket rank 0 adopts for its store (set by cohortrun; adopted once per "        \
      "process, and only if it is a listening TCP socket); -1: bind one")                          \
    X(sockbuf_bytes, RX_K_SIZE, "0", "COHORT_SOCKBUF_BYTES", 0, INT_MAX,                           \
      "SO_SNDBUF and SO_RCVBUF of data sockets; 0: kernel autotuning")                             \
    X(stash_bytes, RX_K_SIZE, "64M", "COHORT_STASH_BYTES", 0, SIZE_MAX,                            \
      "frames that arrive before their receive is posted are kept, per rail, up to this; beyond "  \
      "it the connection pauses")                                                                  \
    X(spare_idle_ms, RX_K_INT, "5000", "COHORT_SPARE_IDLE_MS", 0, INT_MAX,                         \
      "a rail that started no op for this long frees the buffers it keeps for the next ops "       \
      "(early frames' and reduce-scatter scratch, up to COHORT_STASH_BYTES and 4 x 256 MiB); "     \
      "0: keep them")                                                                              \
    X(sync_mode, RX_K_MODE, "selective", "COHORT_SYNC_MODE", 0, COH_SYNC_MODE_COUNT - 1,           \
      "default mode of coh_sync: allreduce, partial, selective or relay")                          \
    X(coordinator, RX_K_INT, "0", "COHORT_COORDINATOR", 0, RX_MAX_WORLD - 1,                       \
      "the rank that runs the scheduler")                                                          \
    X(tick_ms, RX_K_INT, "2", "COHORT_TICK_MS", 1, 10000,                                          \
      "the scheduler fiber's period while a rank waits for a decision or a group runs (it also "   \
      "runs after every event); with nothing to decide it ticks every COHORT_LIVENESS_MS / 10, "   \
      "at most 100 ms")                                                                            \
    X(sched, RX_K_STR, "", "COHORT_SCHED", 0, RX_STR_MAX,                                          \
      "scheduler parameters name=value,... (docs/sched.md); also COHORT_SCHED_<NAME> each")        \
    X(poll_us, RX_K_INT, "50", "COHORT_POLL_US", 0, 1000000,                                       \
      "a rail with ops in flight polls its sockets this long before sleeping")                     \
    X(liveness_ms, RX_K_INT, "3000", "COHORT_LIVENESS_MS", 0, INT_MAX,                             \
      "a rank (or the coordinator) silent this long on the control plane is taken for hung and "   \
      "dropped by every rank; heartbeats every fifth of it; 0: off")                               \
    X(max_inflight, RX_K_INT, "1024", "COHORT_MAX_INFLIGHT", 1, INT_MAX,                           \
      "ops running at once per rail; later ones queue (their timeout starts when they run)")       \
    X(rail_failover, RX_K_INT, "1", "COHORT_RAIL_FAILOVER", 0, 1,                                  \
      "with several rails, a link that fails or stalls moves to another interface and back "       \
      "(frames are kept until the peer acknowledges them; a verbs link resumes on a new QP "       \
      "pair instead); 0: a failed link fails its ops")                                             \
    X(rail_stall_ms, RX_K_INT, "100", "COHORT_RAIL_STALL_MS", 1, INT_MAX,                          \
      "a link whose sent frames go unacknowledged this long (a verbs link: its RDMA writes "       \
      "without a completion), while another rail's do not, is taken for failed")                   \
    X(rail_probe_ms, RX_K_INT, "500", "COHORT_RAIL_PROBE_MS", 1, INT_MAX,                          \
      "a link moved off its interface tries it again this often")                                  \
    X(lb_epoch, RX_K_INT, "16", "COHORT_LB_EPOCH", 0, 1 << 20,                                     \
      "with several rails, world ops are split by the coordinator's rail balancer, whose table "   \
      "is republished every this many ops (docs/multirail.md); 0: even splits")                    \
    X(lb_table, RX_K_STR, "", "COHORT_LB_TABLE", 0, RX_STR_MAX,                                    \
      "file of the rail balancer's table: the coordinator loads it at init if it exists and "      \
      "saves it at finalize")                                                                      \
    X(coord_election, RX_K_INT, "1", "COHORT_COORD_ELECTION", 0, 1,                                \
      "when the coordinator fails, the survivors elect the lowest live rank and go on (its "       \
      "scheduler starts cold); 0: every later sync fails with EPEER")                              \
    X(probe_every, RX_K_INT, "0", "COHORT_PROBE_EVERY", 0, INT_MAX,                                \
      "in relay and allreduce sync modes, every this many syncs all ranks run an alpha-beta "      \
      "probe of every link first (coh_probe; AdapCC: 500); 0: only on demand")                     \
    X(probe_bytes, RX_K_SIZE, "1M", "COHORT_PROBE_BYTES", 4096, 1ull << 30,                        \
      "bytes of a probe's bandwidth transfer, each way")                                           \
    X(sync_probe_rounds, RX_K_INT, "0", "COHORT_SYNC_PROBE_ROUNDS", 0, 1 << 16,                    \
      "the first partial or selective coh_sync of every rank first probes its links to this "      \
      "many peers (rounds of coh_probe's pairs), so the coordinator groups by measured rates "     \
      "from the start (docs/sync.md, Link estimates); 0: the rates come from the syncs' own "      \
      "frames only")                                                                               \
    X(rejoin, RX_K_INT, "0", "COHORT_REJOIN", 0, 1,                                                \
      "1: this process restarts a rank that failed (same rank, world, token and store); "          \
      "coh_init rejoins the running job and coh_comm_grow adds it back (docs/relay.md)")           \
    X(relay_segments, RX_K_INT, "8", "COHORT_RELAY_SEGMENTS", 1, 64,                               \
      "phase 1 of a relay group runs as up to this many consecutive ops of 256 KiB or more, so "   \
      "a late rank's data joins the ones still to come (the coordinator's setting counts); 1: "    \
      "its data always comes in phase 2")                                                          \
    X(udp_seg_bytes, RX_K_SIZE, "0", "COHORT_UDP_SEG_BYTES", 0, 65000,                             \
      "payload bytes of a bounded-loss data datagram (rounded down to 8); 0: what fills the "      \
      "rail interface's MTU (1448 for 1500 bytes; every rank must get the same)")                  \
    X(udp_rate_mbps, RX_K_INT, "10000", "COHORT_UDP_RATE_MBPS", 1, 10000000,                       \
      "line rate of udp rails (set it to the NIC's): all of a rail's flows together stay "         \
      "below it; a flow starts there and a retransmission pass restarts there (DLCP Fig. 7)")      \
    X(udp_period_us, RX_K_INT, "1000", "COHORT_UDP_PERIOD_US", 100, 1000000,                       \
      "a udp receiver reports its receiving rate to the sender this often")                        \
    X(udp_delta_pct, RX_K_INT, "200", "COHORT_UDP_DELTA_PCT", 100, 10000,                          \
      "a udp flow sending above this percentage of its receiving rate halves its rate")            \
    X(udp_rcvbuf_bytes, RX_K_SIZE, "8M", "COHORT_UDP_RCVBUF_BYTES", 65536, 1ull << 30,             \
      "receive buffer of a udp rail's socket")                                                     \
    X(udp_chunk_bytes, RX_K_SIZE, "512K", "COHORT_UDP_CHUNK_BYTES", 1, SIZE_MAX,                   \
      "a bounded-loss allreduce pipelines each rank's block in chunks of this size (at most 64; "  \
      "its own COHORT_CHUNK_BYTES: each chunk is a flow with its own control round trips; every "  \
      "rank must get the same)")                                                                   \
    X(udp_spray, RX_K_INT, "1", "COHORT_UDP_SPRAY", 0, 1,                                          \
      "with several udp rails of the same datagram size, a bounded-loss allreduce sprays its "     \
      "datagrams over all of them (up to 4), rate-controlled per rail; 0: each carries its own "   \
      "slice (every rank must get the same)")                                                      \
    X(shm, RX_K_INT, "1", "COHORT_SHM", 0, 1,                                                      \
      "ranks on the same host (COHORT_HOST_ID) connect through shared memory on every rail "       \
      "(docs/shm.md); 0: through each rail's network transport")                                   \
    X(shm_ring_bytes, RX_K_SIZE, "0", "COHORT_SHM_RING_BYTES", 0, 1ull << 30,                      \
      "bytes of each shared-memory ring (one per direction per peer on the host and rail; a "      \
      "power of two, at least 64K); 0 (auto): 1M up to 65 ranks on the host (COHORT_LOCAL_SIZE), " \
      "2M up to 33 when they outnumber its cores, then smaller so a rank's rings on a rail stay "  \
      "within 64M (at least 256K)")                                                                \
    X(shm_cma_bytes, RX_K_SIZE, "0", "COHORT_SHM_CMA_BYTES", 0, 1ull << 40,                        \
      "shared-memory frames of at least this many bytes are read by the receiver straight from "   \
      "the sender's memory (process_vm_readv, where the kernel permits it): one copy instead of "  \
      "two, but the pages are pinned on every read (slower here than the ring's second copy, "     \
      "docs/shm.md); 0: never")                                                                    \
    X(hier, RX_K_INT, "-1", "COHORT_HIER", -1, 1,                                                  \
      "collectives across hosts of the same number (>= 2) of ranks: 1 hierarchical (inside each "  \
      "host, then between hosts, then inside again); 0 flat; -1 (auto) whichever the link model "  \
      "(COHORT_HIER_NET_*, COHORT_HIER_LOCAL_*) expects to be faster (every rank must get the "    \
      "same)")                                                                                     \
    X(hier_net_us, RX_K_INT, "20", "COHORT_HIER_NET_US", 0, 10000000,                              \
      "the link model of COHORT_HIER=-1: latency of a message between hosts, microseconds")        \
    X(hier_net_mbps, RX_K_INT, "10000", "COHORT_HIER_NET_MBPS", 1, INT_MAX,                        \
      "the link model: one rank's rate to another host, Mbit/s (its share of the NIC)")            \
    X(hier_local_us, RX_K_INT, "2", "COHORT_HIER_LOCAL_US", 0, 10000000,                           \
      "the link model: latency of a message inside a host, microseconds")                          \
    X(hier_local_mbps, RX_K_INT, "40000", "COHORT_HIER_LOCAL_MBPS", 1, INT_MAX,                    \
      "the link model: one rank's rate to another on its host, Mbit/s")

/* Knobs without a coh_config_t field: X(name, kind, default, env, lo, hi, help) */
#define RX_ENV_MAP(X)                                                                              \
    X(algo, RX_K_STR, "auto", "COHORT_ALGO", 1, 8,                                                 \
      "allreduce plan above COHORT_SMALL_BYTES: ring, hd (halving-doubling: the ring's bytes in "  \
      "2 log2(n) steps) or auto: the ring with several rails or when the whole job talks "         \
      "through shared memory, else "                                                               \
      "the cheaper by the link model (COHORT_HIER_NET_* between hosts, COHORT_HIER_LOCAL_* on "    \
      "one): hd for powers of two (docs/perf.md; every rank must get the same)")                   \
    X(small_algo, RX_K_STR, "auto", "COHORT_SMALL_ALGO", 1, 8,                                     \
      "allreduce plan at or below COHORT_SMALL_BYTES: rd (recursive doubling), star (every rank "  \
      "to rank 0, which sends the sum back: 2(n-1) messages) or auto: the cheaper by the link "    \
      "model, which counts each message's CPU (COHORT_HIER_LOCAL_MSG_US) against the host's "      \
      "cores when every rank is on one host: star from 4 ranks on 2 cores, else rd "               \
      "(docs/perf.md; every rank must get the same)")                                              \
    X(hier_local_msg_us, RX_K_INT, "5", "COHORT_HIER_LOCAL_MSG_US", 0, 1000000,                    \
      "the link model: CPU a message inside a host costs its sender, and again its receiver, "     \
      "microseconds (the kernel's work included); with every rank on one host, the sum over the "  \
      "ranks is shared by its cores (every rank must get the same)")                               \
    X(host_id, RX_K_STR, "", "COHORT_HOST_ID", 0, 255,                                             \
      "who shares this host: ranks with the same id talk through shared memory; empty: the "       \
      "kernel's boot id (every rank of a machine, whatever its network namespace)")                \
    X(shm_dir, RX_K_STR, "/dev/shm", "COHORT_SHM_DIR", 1, 80,                                      \
      "where the job's shared-memory sockets live (in cohort-UID-HASH, mode 0700; the rings "      \
      "themselves have no name)")                                                                  \
    X(store_port_offset, RX_K_INT, "1", "COHORT_STORE_PORT_OFFSET", 0, 1000,                       \
      "added to MASTER_PORT when the store address comes from torchrun's variables")               \
    X(local_size, RX_K_INT, "1", "COHORT_LOCAL_SIZE", 1, RX_MAX_WORLD,                             \
      "ranks on this host (set by cohortrun; else LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE)")  \
    X(sched_trace, RX_K_STR, "", "COHORT_SCHED_TRACE", 0, RX_STR_MAX,                              \
      "warm start of the coordinator: a CSV worker,bandwidth_gbps,compute_s (cohort-sim "          \
      "replay's)")                                                                                 \
    X(timeline, RX_K_STR, "", "COHORT_TIMELINE", 0, RX_STR_MAX,                                    \
      "write a Chrome trace of this rank (requests, waits, syncs, the coordinator's launches, "    \
      "rail events) to this file at finalize (%d: the rank; else FILE.RANK.json); "                \
      "tools/cohort_timeline.py merges the ranks (docs/load.md). Every rank or none")              \
    X(gpu, RX_K_STR, "auto", "COHORT_GPU", 1, 8,                                                   \
      "device buffers (docs/gpu.md): auto uses CUDA when this build has it and a device is "       \
      "visible; cuda insists on it; off treats every pointer as host memory; host emulates a "     \
      "device in host memory (tests: the staging pipeline without a GPU)")                         \
    X(gpu_chunk_bytes, RX_K_SIZE, "4M", "COHORT_GPU_CHUNK_BYTES", 4096, 1ull << 30,                \
      "device-buffer allreduces and broadcasts are staged through host memory in pipelined "       \
      "chunks of this size (copy-out of one overlaps the network of the one before; every rank "   \
      "must get the same)")                                                                        \
    X(gpu_ipc, RX_K_INT, "1", "COHORT_GPU_IPC", 0, 1,                                              \
      "device-buffer collectives among ranks that all share a host go through each other's "       \
      "device memory (CUDA IPC): reductions as device kernels, no host staging; 0: staged like "   \
      "any other (every rank must get the same)")                                                  \
    X(verbs_device, RX_K_STR, "", "COHORT_VERBS_DEVICE", 0, 63,                                    \
      "the RDMA device of NIC:verbs rails (mlx5_0); empty: the one behind the named interface "    \
      "(docs/verbs.md)")                                                                           \
    X(verbs_provider, RX_K_STR, "rdma-core", "COHORT_VERBS_PROVIDER", 1, 15,                       \
      "who carries NIC:verbs rails: rdma-core (libibverbs and an RDMA NIC) or soft (cohort's "     \
      "reliable connections in user space over TCP, for machines without RDMA; docs/verbs.md)")    \
    X(verbs_port, RX_K_INT, "1", "COHORT_VERBS_PORT", 1, 255, "the RDMA device's port")            \
    X(verbs_gid_index, RX_K_INT, "-1", "COHORT_VERBS_GID_INDEX", -1, 255,                          \
      "the GID of that port to use; -1: picked per device (InfiniBand: 0; RoCE: the RoCE v2 "      \
      "entry with the rail's address, IPv4-mapped or IPv6, e.g. 3), and again when the table "     \
      "changes")                                                                                   \
    X(verbs_move, RX_K_INT, "1", "COHORT_VERBS_MOVE", 0, 1,                                        \
      "with failover, a verbs link whose device's port is down (or whose dials through its own "   \
      "interface go unanswered) resumes on the RDMA device behind another rail's interface, "      \
      "and moves back when its own answers; 0: it waits for its own device "                       \
      "(COHORT_VERBS_RESUME_MS, then its ops fail)")                                               \
    X(verbs_resume_ms, RX_K_INT, "5000", "COHORT_VERBS_RESUME_MS", 100, 3600000,                   \
      "a failed verbs link that finds no way back (its own device, or with COHORT_VERBS_MOVE "     \
      "another rail's) within this many milliseconds ends, and its ops fail with EPEER (a killed " \
      "peer's refusal ends it at once)")                                                           \
    X(verbs_ring_bytes, RX_K_SIZE, "1M", "COHORT_VERBS_RING_BYTES", 65536, 1ull << 30,             \
      "each verbs link's ring per direction, registered memory (a power of two; every rank must "  \
      "get the same)")                                                                             \
    X(verbs_zcopy_bytes, RX_K_SIZE, "64K", "COHORT_VERBS_ZCOPY_BYTES", 0, 1ull << 30,              \
      "verbs rails write frames from this size up straight from memory declared with "             \
      "coh_mem_register (no copy into the staging ring); 0: never")                                \
    X(verbs_reg_cache_bytes, RX_K_SIZE, "4G", "COHORT_VERBS_REG_CACHE_BYTES", 0, 1ull << 50,       \
      "declared memory each verbs rail keeps registered (pinned) at most; the least recently "     \
      "used unused registrations go first; 0: no bound")                                           \
    X(test_fault, RX_K_STR, "", "COHORT_TEST_FAULT", 0, RX_STR_MAX,                                \
      "tests only: die-after-joined-relay kills this process 20 ms after a relay op its own "      \
      "data joined has ended (between a relay group's phases); die-after-phase1 20 ms after it "   \
      "reported a relay group's phase 1 as a ready member; hold-relay-done holds a relay's "       \
      "report of phase 1 back 300 ms")                                                             \
    X(test_udp_drop, RX_K_INT, "0", "COHORT_TEST_UDP_DROP_PPM", 0, 1000000,                        \
      "tests only: udp rails drop this many of every million datagrams that arrive, data and "     \
      "control (random loss without a network namespace)")                                         \
    X(test_udp_send_fail, RX_K_INT, "0", "COHORT_TEST_UDP_SEND_FAIL", 0, 1 << 20,                  \
      "tests only: n: on every rank, the n-th batch of datagrams a udp rail sends fails as "       \
      "refused (EPERM, as a firewall's reject): the op fails; 0: none")                            \
    X(test_udp_ctl_dgram, RX_K_INT, "0", "COHORT_TEST_UDP_CTL_DGRAM", 0, 1,                        \
      "tests only: 1 sends udp control messages (DONE, NACK, FIN) as datagrams alone, without "    \
      "their reliable TCP copy")                                                                   \
    X(test_tcp_drop_probe, RX_K_INT, "0", "COHORT_TEST_TCP_DROP_PROBE", 0, 1,                      \
      "tests only: 1: on each TCP rail, the higher rank of a link off its interface closes the "   \
      "first dial that would move it back, unanswered (as a peer gone mid-handshake)")             \
    X(test_resume_delay, RX_K_INT, "0", "COHORT_TEST_RESUME_DELAY_MS", 0, 10000,                   \
      "tests only: the lower rank of a failing-over TCP link connects its resume dials this many " \
      "ms late (the higher rank's dials meet a dial in progress and are turned away meanwhile)")   \
    X(test_verbs_port_down, RX_K_INT, "0", "COHORT_TEST_VERBS_PORT_DOWN_MS", 0, 10000,             \
      "tests only: a verbs link cut by a test also takes its device's port down this long in the " \
      "engine's eyes, as a NIC's link would go: the link moves to another rail's device")          \
    X(test_verbs_ready_delay, RX_K_INT, "0", "COHORT_TEST_VERBS_READY_DELAY_MS", 0, 10000,         \
      "tests only: the answering side of a verbs link's resume takes the dialler's READY this "    \
      "many ms late (the dialler's first RDMA writes then always come first)")                     \
    X(test_verbs_lose_ready, RX_K_INT, "-1", "COHORT_TEST_VERBS_LOSE_READY_FROM", -1, 1 << 20,     \
      "tests only: a rank r: on every other rank and verbs rail, the first READY from r that "     \
      "ends "                                                                                      \
      "a resume is lost, and the answering side's socket dies without a word (r, live already, "   \
      "sees nothing); -1: none")                                                                   \
    X(test_verbs_poke_late, RX_K_INT, "0", "COHORT_TEST_VERBS_POKE_LATE_MS", 0, 10000,             \
      "tests only: the higher rank of a resuming verbs link pokes at once (not after 200 ms "      \
      "without a dial), and each poke's HELLO goes this many ms after it connects (so that it "    \
      "can cross the dialler's dial); 0: off")                                                     \
    X(test_verbs_rts_fail, RX_K_INT, "-1", "COHORT_TEST_VERBS_RTS_FAIL_ON", -1, 1 << 20,           \
      "tests only: a rank r: on r, the first QP brought up for a resume on each verbs rail is "    \
      "refused at RTS (as when its GID entry went from under it; the QP is left in RTR); -1: "     \
      "none")                                                                                      \
    X(test_verbs_rts_fail_peer, RX_K_INT, "-1", "COHORT_TEST_VERBS_RTS_FAIL_PEER", -1, 1 << 20,    \
      "tests only: with COHORT_TEST_VERBS_RTS_FAIL_ON, only the QPs of the link to this rank "     \
      "fail (a link that a slow run fails over besides is left alone); -1: every link")            \
    X(test_verbs_create_fail, RX_K_INT, "0", "COHORT_TEST_VERBS_CREATE_FAIL", 0, 1,                \
      "tests only: 1: the QPs COHORT_TEST_VERBS_RTS_FAIL_ON names fail at their creation "         \
      "(ibv_create_qp, as out of memory), not at RTS")                                             \
    X(test_verbs_rts_fail_times, RX_K_INT, "1", "COHORT_TEST_VERBS_RTS_FAIL_TIMES", 0, 1 << 20,    \
      "tests only: with COHORT_TEST_VERBS_RTS_FAIL_ON, the number of resume QPs refused at RTS "   \
      "on each verbs rail, one after the other; 0: every one (the resume then ends at "            \
      "COHORT_VERBS_RESUME_MS)")

typedef struct rx_knob {
    const char *name; /* the coh_config_t field (or the env-only knob's name) */
    rx_knob_kind kind;
    const char *deflt;
    const char *env;
    long long lo;
    unsigned long long hi;
    const char *help;
    ptrdiff_t off; /* in coh_config_t; -1 for environment-only knobs */
} rx_knob_t;

/* The knobs, fields first, then environment-only ones. */
const rx_knob_t *rx_knobs(int *count);
/* The field knob called name, or NULL. */
const rx_knob_t *rx_knob_find(const char *name);

/* Parse text as the knob's kind and check its bounds; write the value into
 * cfg (nothing for environment-only knobs). Strings are stored as given
 * (not copied). where names the source in the error ("COHORT_TIMEOUT_MS",
 * "field 'timeout_ms'"). Returns 0 or COH_EINVAL with coh_last_error set. */
int rx_knob_set(coh_config_t *cfg, const rx_knob_t *k, const char *text, const char *where);
/* An environment-only int knob (RX_ENV_MAP) from its variable, parsed and
 * bounded by the table; its default when unset. COH_EINVAL when it does
 * not parse. */
int rx_env_knob_int(const char *name, int *out);
/* The same for a size knob (K/M/G suffixes). */
int rx_env_knob_size(const char *name, size_t *out);
/* An env-only string knob: its value, or its default; checked for length. */
int rx_env_knob_str(const char *name, const char **out);
/* Check every field of cfg against the table, then the fields that depend
 * on each other (rank < world_size, coordinator < world_size, a store for
 * a world > 1). */
int rx_config_validate(const coh_config_t *cfg);
/* spin_us resolved: -1 (auto) becomes 5000. */
int rx_config_spin_us(const coh_config_t *cfg);
/* shm_ring_bytes resolved: 0 (auto) sizes the rings by the ranks on the
 * host and whether they outnumber its cores (64 MiB per rank and rail, each
 * ring 256 KiB to 1 MiB, 2 MiB oversubscribed). */
size_t rx_config_shm_ring_bytes(const coh_config_t *cfg, int local_n, bool oversubscribed);
/* Ranks on this host, from the launcher's variables (1 when none says). */
int rx_config_local_size(void);
/* Online CPUs of this host; 0 if unknown. */
int rx_config_cores(void);
/* More local ranks than cores (from the launcher's variables). */
bool rx_config_oversubscribed(void);

#endif
