/*
 * ff_c10d.cc - cohort as a torch.distributed (c10d) backend, for torch 1.13.
 *
 * A c10d::ProcessGroup whose collectives are libcohort requests on CPU
 * tensors, in place (no copy) where the tensor layout allows. One cohort
 * context per process group: the group's rank 0 opens cohort's bootstrap
 * store on a port of its own and publishes "host:port token" through the
 * store torch hands the backend (torchrun's, or the one init_method names),
 * so the group bootstraps the same way under torchrun, cohortrun or any
 * launcher. cohort.torch (ffi/python/cohort/torch) loads this module and
 * registers the "cohort" backend.
 *
 * Completions: one thread per group waits on the requests in submission
 * order, runs what must follow (copying staged outputs back) and completes
 * the Work and its Future, as gloo's worker threads do. Timeouts: the
 * group's timeout is the context's operation timeout (an op fails after it
 * without progress); a dead peer fails an op at once through its socket.
 */
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cohort.h"

namespace py = pybind11;

namespace cohort_c10d
{

/* What a failed cohort call says, as torch users read it. */
static std::string errtext(const char *what, int st, const char *detail)
{
    std::string s = std::string("cohort ") + what + ": [" + coh_status_name(st) + "] ";
    s += (detail && *detail) ? detail : coh_strerror(st);
    return s;
}

[[noreturn]] static void fail(const char *what, int st)
{
    throw std::runtime_error(errtext(what, st, coh_last_error()));
}

class CohortWork : public c10d::Work
{
  public:
    CohortWork(int rank, c10d::OpType type, const char *title, std::vector<at::Tensor> outputs)
        : c10d::Work(rank, type, title), outputs_(std::move(outputs)),
          future_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get())))
    {
    }

    bool isCompleted() override
    {
        std::lock_guard<std::mutex> lk(mutex_);
        return completed_;
    }
    bool isSuccess() const override
    {
        std::lock_guard<std::mutex> lk(mutex_);
        return completed_ && !exception_;
    }
    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

    /* Called once, by the group's completion thread. */
    void complete(std::exception_ptr err)
    {
        keep_.clear();
        after_ = nullptr;
        finish(err);
        if (err)
            future_->setError(err);
        else
            future_->markCompleted(c10::IValue(outputs_));
    }

    std::vector<at::Tensor> outputs_;
    std::vector<at::Tensor> keep_; /* inputs and staging cohort reads or writes */
    std::function<void()> after_;  /* runs on success before completion (copy-outs) */
    const char *what_ = "";

  private:
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

struct Pending {
    coh_request_t *req;
    c10::intrusive_ptr<CohortWork> work;
};

/* The group's cohort dtype for a tensor (bool goes as u8, complex as pairs). */
struct Typed {
    coh_dtype dt;
    size_t count;
    bool is_bool, is_complex;
};

static Typed typed(const at::Tensor &t, const char *what)
{
    TORCH_CHECK(t.device().is_cpu(), "cohort ", what, ": only CPU tensors (got ", t.device(),
                "); move the tensor to the CPU or use the nccl backend for CUDA tensors");
    TORCH_CHECK(t.layout() == at::kStrided, "cohort ", what, ": only dense tensors (got ",
                t.layout(), ")");
    TORCH_CHECK(t.is_contiguous(), "cohort ", what,
                ": the tensor is not contiguous; cohort works in place on its memory "
                "(pass tensor.contiguous() and copy the result back)");
    Typed r{COH_F32, (size_t)t.numel(), false, false};
    switch (t.scalar_type()) {
    case at::kFloat: r.dt = COH_F32; break;
    case at::kDouble: r.dt = COH_F64; break;
    case at::kHalf: r.dt = COH_F16; break;
    case at::kBFloat16: r.dt = COH_BF16; break;
    case at::kInt: r.dt = COH_I32; break;
    case at::kLong: r.dt = COH_I64; break;
    case at::kByte: r.dt = COH_U8; break;
    case at::kBool:
        r.dt = COH_U8;
        r.is_bool = true;
        break;
    case at::kComplexFloat:
        r.dt = COH_F32;
        r.count *= 2;
        r.is_complex = true;
        break;
    case at::kComplexDouble:
        r.dt = COH_F64;
        r.count *= 2;
        r.is_complex = true;
        break;
    default:
        TORCH_CHECK(false, "cohort ", what, ": dtype ", t.scalar_type(),
                    " is not supported (float32, float64, float16, bfloat16, int32, int64, "
                    "uint8, bool, complex64, complex128 are)");
    }
    return r;
}

static coh_redop redop(const c10d::ReduceOp &op, const Typed &ty, const char *what)
{
    using R = c10d::ReduceOp;
    coh_redop o = COH_SUM;
    switch (op.op_) {
    case R::SUM: o = COH_SUM; break;
    case R::AVG: o = COH_AVG; break;
    case R::PRODUCT: o = COH_PROD; break;
    case R::MIN: o = COH_MIN; break;
    case R::MAX: o = COH_MAX; break;
    default:
        TORCH_CHECK(false, "cohort ", what,
                    ": ReduceOp is not supported (SUM, AVG, PRODUCT, MIN, MAX are)");
    }
    if (ty.is_bool) {
        /* logical or / and on 0 and 1 */
        TORCH_CHECK(o != COH_AVG, "cohort ", what, ": AVG of a bool tensor");
        if (o == COH_SUM) o = COH_MAX;
        if (o == COH_PROD) o = COH_MIN;
    }
    if (ty.is_complex)
        TORCH_CHECK(o == COH_SUM || o == COH_AVG, "cohort ", what,
                    ": only SUM and AVG of complex tensors");
    return o;
}

static const at::Tensor &single(const std::vector<at::Tensor> &ts, const char *what)
{
    TORCH_CHECK(ts.size() == 1, "cohort ", what, ": expects one tensor per call, got ", ts.size());
    return ts[0];
}

/* Copy consecutive pieces of flat back into outs (a staged output). */
static void unflatten(const at::Tensor &flat, std::vector<at::Tensor> &outs)
{
    int64_t off = 0;
    for (auto &o : outs) {
        o.copy_(flat.narrow(0, off, o.numel()).view_as(o));
        off += o.numel();
    }
}

/* Tensors laid end to end in one buffer (torch's chunks of one tensor are). */
static bool adjacent(const std::vector<at::Tensor> &ts)
{
    for (size_t i = 0; i + 1 < ts.size(); i++) {
        if (!ts[i].is_contiguous() || !ts[i + 1].is_contiguous()) return false;
        auto *end = static_cast<char *>(ts[i].data_ptr()) + ts[i].nbytes();
        if (end != ts[i + 1].data_ptr()) return false;
    }
    return !ts.empty() && ts.back().is_contiguous();
}

class ProcessGroupCohort : public c10d::ProcessGroup
{
  public:
    ProcessGroupCohort(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                       std::chrono::milliseconds timeout)
        : c10d::ProcessGroup(rank, size), timeout_(timeout)
    {
        bootstrap(store);
        progress_ = std::thread([this] { progress(); });
    }

    ~ProcessGroupCohort() override
    {
        /* The last reference may drop in Python (GIL held), and the
         * completion thread may need the GIL to free a tensor: wait for it
         * without the GIL. */
        if (Py_IsInitialized() && PyGILState_Check()) {
            py::gil_scoped_release nogil;
            shutdown();
        } else {
            shutdown();
        }
    }

    const std::string getBackendName() const override { return "cohort"; }

    /* Cancel what still runs, close the connections. Idempotent. */
    void shutdown()
    {
        std::lock_guard<std::mutex> g(shutdown_mu_);
        if (!ctx_) return;
        {
            std::lock_guard<std::mutex> lk(qmu_);
            stop_ = true;
        }
        qcv_.notify_all();
        int st = coh_finalize(ctx_); /* pending requests end ECANCELED */
        (void)st;
        if (progress_.joinable()) progress_.join();
        ctx_ = nullptr;
        comm_ = nullptr;
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override
    {
        const char *what = "broadcast";
        auto &t = single(tensors, what);
        Typed ty = typed(t, what);
        TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "cohort broadcast: root ",
                    opts.rootRank, " is not a rank of a group of ", getSize());
        auto w = work(c10d::OpType::BROADCAST, "cohort:broadcast", {t});
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_broadcast(comm_, t.data_ptr(), ty.count, ty.dt, (int)opts.rootRank, rq);
        });
    }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override
    {
        const char *what = "allreduce";
        auto &t = single(tensors, what);
        Typed ty = typed(t, what);
        coh_redop op = redop(opts.reduceOp, ty, what);
        auto w = work(c10d::OpType::ALLREDUCE, "cohort:all_reduce", {t});
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_allreduce(comm_, t.data_ptr(), t.data_ptr(), ty.count, ty.dt, op, rq);
        });
    }

    c10::intrusive_ptr<c10d::Work>
    allreduce_coalesced(std::vector<at::Tensor> &tensors,
                        const c10d::AllreduceCoalescedOptions &opts) override
    {
        const char *what = "allreduce_coalesced";
        TORCH_CHECK(!tensors.empty(), "cohort ", what, ": no tensors");
        for (auto &t : tensors) {
            typed(t, what);
            TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "cohort ", what,
                        ": the tensors differ in dtype");
        }
        std::vector<at::Tensor> flat_in;
        for (auto &t : tensors) flat_in.push_back(t.reshape({-1}));
        at::Tensor flat = at::cat(flat_in);
        Typed ty = typed(flat, what);
        coh_redop op = redop(opts.reduceOp, ty, what);
        auto w = work(c10d::OpType::ALLREDUCE_COALESCED, "cohort:allreduce_coalesced", tensors);
        w->keep_ = {flat};
        std::vector<at::Tensor> outs = tensors;
        w->after_ = [flat, outs]() mutable { unflatten(flat, outs); };
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_allreduce(comm_, flat.data_ptr(), flat.data_ptr(), ty.count, ty.dt, op, rq);
        });
    }

    /* To the root: an allreduce, into a scratch copy on the other ranks
     * (whose tensors torch leaves as they were). */
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts) override
    {
        const char *what = "reduce";
        auto &t = single(tensors, what);
        Typed ty = typed(t, what);
        coh_redop op = redop(opts.reduceOp, ty, what);
        TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "cohort reduce: root ",
                    opts.rootRank, " is not a rank of a group of ", getSize());
        at::Tensor buf = getRank() == opts.rootRank ? t : t.clone();
        auto w = work(c10d::OpType::REDUCE, "cohort:reduce", {t});
        w->keep_ = {buf};
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_allreduce(comm_, buf.data_ptr(), buf.data_ptr(), ty.count, ty.dt, op, rq);
        });
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &) override
    {
        const char *what = "allgather";
        auto &in = single(inputs, what);
        Typed ty = typed(in, what);
        TORCH_CHECK(outputs.size() == 1, "cohort allgather: expects one output list, got ",
                    outputs.size());
        auto &outs = outputs[0];
        TORCH_CHECK((int)outs.size() == getSize(), "cohort allgather: the output list has ",
                    outs.size(), " tensors, the group ", getSize(), " ranks");
        for (auto &o : outs)
            TORCH_CHECK(o.scalar_type() == in.scalar_type() && o.numel() == in.numel() &&
                            o.device().is_cpu(),
                        "cohort allgather: every output must match the input (dtype ",
                        in.scalar_type(), ", ", in.numel(), " elements, CPU)");
        auto w = work(c10d::OpType::ALLGATHER, "cohort:all_gather", outs);
        at::Tensor recv;
        if (adjacent(outs)) {
            recv = outs[0]; /* one buffer already: gather straight into it */
        } else {
            recv = at::empty({(int64_t)getSize() * in.numel()}, in.options());
            std::vector<at::Tensor> o = outs;
            w->after_ = [recv, o]() mutable { unflatten(recv, o); };
        }
        w->keep_ = {in, recv};
        void *rbuf = recv.data_ptr();
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_allgather(comm_, in.data_ptr(), rbuf, ty.count, ty.dt, rq);
        });
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &) override
    {
        const char *what = "all_gather_into_tensor";
        Typed ty = typed(input, what);
        typed(output, what);
        TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                        output.numel() == input.numel() * getSize(),
                    "cohort all_gather_into_tensor: output must hold world_size (", getSize(),
                    ") x input (", input.numel(), ") elements of ", input.scalar_type());
        auto w = work(c10d::OpType::_ALLGATHER_BASE, "cohort:all_gather_into_tensor", {output});
        w->keep_ = {input};
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_allgather(comm_, input.data_ptr(), output.data_ptr(), ty.count, ty.dt, rq);
        });
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override
    {
        const char *what = "reduce_scatter";
        auto &out = single(outputs, what);
        Typed ty = typed(out, what);
        coh_redop op = redop(opts.reduceOp, ty, what);
        TORCH_CHECK(inputs.size() == 1, "cohort reduce_scatter: expects one input list");
        auto &ins = inputs[0];
        TORCH_CHECK((int)ins.size() == getSize(), "cohort reduce_scatter: the input list has ",
                    ins.size(), " tensors, the group ", getSize(), " ranks");
        for (auto &i : ins)
            TORCH_CHECK(i.scalar_type() == out.scalar_type() && i.numel() == out.numel() &&
                            i.device().is_cpu(),
                        "cohort reduce_scatter: every input must match the output (dtype ",
                        out.scalar_type(), ", ", out.numel(), " elements, CPU)");
        at::Tensor send;
        if (adjacent(ins)) {
            send = ins[0];
        } else {
            std::vector<at::Tensor> flat;
            for (auto &i : ins) flat.push_back(i.reshape({-1}));
            send = at::cat(flat);
        }
        auto w = work(c10d::OpType::REDUCE_SCATTER, "cohort:reduce_scatter", {out});
        w->keep_ = {send};
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_reduce_scatter(comm_, send.data_ptr(), out.data_ptr(), ty.count, ty.dt, op,
                                      rq);
        });
    }

    c10::intrusive_ptr<c10d::Work>
    _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                         const c10d::ReduceScatterOptions &opts) override
    {
        const char *what = "reduce_scatter_tensor";
        Typed ty = typed(output, what);
        typed(input, what);
        coh_redop op = redop(opts.reduceOp, ty, what);
        TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                        input.numel() == output.numel() * getSize(),
                    "cohort reduce_scatter_tensor: input must hold world_size (", getSize(),
                    ") x output (", output.numel(), ") elements of ", output.scalar_type());
        auto w = work(c10d::OpType::_REDUCE_SCATTER_BASE, "cohort:reduce_scatter_tensor", {output});
        w->keep_ = {input};
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_reduce_scatter(comm_, input.data_ptr(), output.data_ptr(), ty.count, ty.dt,
                                      op, rq);
        });
    }

    /* Gather to the root and scatter from it, through allgather and broadcast. */
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::GatherOptions &opts) override
    {
        const char *what = "gather";
        auto &in = single(inputs, what);
        Typed ty = typed(in, what);
        bool root = getRank() == opts.rootRank;
        TORCH_CHECK(root ? outputs.size() == 1 && (int)outputs[0].size() == getSize()
                         : outputs.empty() || outputs[0].empty(),
                    "cohort gather: the root passes a list of world_size tensors, the others "
                    "none");
        at::Tensor recv = at::empty({(int64_t)getSize() * in.numel()}, in.options());
        std::vector<at::Tensor> outs = root ? outputs[0] : std::vector<at::Tensor>{};
        auto w = work(c10d::OpType::GATHER, "cohort:gather", outs);
        w->keep_ = {in, recv};
        w->after_ = [recv, outs]() mutable { unflatten(recv, outs); };
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_allgather(comm_, in.data_ptr(), recv.data_ptr(), ty.count, ty.dt, rq);
        });
    }

    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts) override
    {
        const char *what = "scatter";
        auto &out = single(outputs, what);
        Typed ty = typed(out, what);
        bool root = getRank() == opts.rootRank;
        TORCH_CHECK(root ? inputs.size() == 1 && (int)inputs[0].size() == getSize()
                         : inputs.empty() || inputs[0].empty(),
                    "cohort scatter: the root passes a list of world_size tensors, the others "
                    "none");
        at::Tensor all;
        if (root) {
            std::vector<at::Tensor> flat;
            for (auto &i : inputs[0]) flat.push_back(i.reshape({-1}));
            all = at::cat(flat);
        } else {
            all = at::empty({(int64_t)getSize() * out.numel()}, out.options());
        }
        int me = getRank();
        auto w = work(c10d::OpType::SCATTER, "cohort:scatter", {out});
        w->keep_ = {all};
        w->after_ = [all, out, me]() mutable {
            out.copy_(all.narrow(0, (int64_t)me * out.numel(), out.numel()).view_as(out));
        };
        size_t count = ty.count * (size_t)getSize();
        return submit(w, what, [&](coh_request_t **rq) {
            return coh_broadcast(comm_, all.data_ptr(), count, ty.dt, (int)opts.rootRank, rq);
        });
    }

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &) override
    {
        auto w = work(c10d::OpType::BARRIER, "cohort:barrier", {});
        return submit(w, "barrier", [&](coh_request_t **rq) { return coh_barrier(comm_, rq); });
    }

    /* One partial / selective sync of t (in place) with the group the
     * scheduler forms (coh_sync_ex); blocks, and returns the group. */
    py::dict sync(at::Tensor t, uint64_t iteration, double weight, const std::string &mode)
    {
        const char *what = "sync";
        Typed ty = typed(t, what);
        TORCH_CHECK(!ty.is_bool && !ty.is_complex, "cohort sync: a real tensor");
        coh_sync_mode m = COH_SYNC_DEFAULT;
        if (!mode.empty() && mode != "default" && coh_sync_mode_from_name(mode.c_str(), &m) < 0)
            TORCH_CHECK(false, "cohort sync: unknown mode '", mode,
                        "' (default, allreduce, partial, selective, relay)");
        live(what);
        coh_request_t *rq = nullptr;
        int st;
        {
            py::gil_scoped_release nogil;
            st = coh_sync_ex(comm_, t.data_ptr(), ty.count, ty.dt, iteration, weight, m, &rq);
            if (st == 0) st = wait_done(rq);
        }
        if (st < 0) {
            std::string msg = rq ? errtext(what, st, coh_request_error(rq)) : "";
            if (!rq) msg = errtext(what, st, coh_last_error());
            if (rq) coh_request_free(rq);
            throw std::runtime_error(msg);
        }
        in_schedule_ = true;
        coh_group_info_t gi;
        py::dict d;
        if (coh_request_group(rq, &gi) == 0) {
            py::list members;
            for (int i = 0; i < gi.size; i++) members.append(gi.members[i]);
            d["members"] = members;
            d["full"] = (bool)gi.full;
            d["total_weight"] = gi.total_weight;
            d["wait_us"] = gi.wait_us;
            d["comm_us"] = gi.comm_us;
            d["group_id"] = gi.group_id;
        }
        coh_request_free(rq);
        return d;
    }

    /* Out of the sync schedule, so no group waits for this rank. */
    void sync_leave()
    {
        live("sync_leave");
        if (!in_schedule_.exchange(false)) return;
        int st = coh_sync_leave(comm_);
        if (st < 0) fail("sync_leave", st);
    }

    py::dict stats()
    {
        live("stats");
        coh_stats_t s;
        int st = coh_ctx_stats(ctx_, &s);
        if (st < 0) fail("stats", st);
        py::dict d;
        d["bytes_sent"] = s.bytes_sent;
        d["bytes_received"] = s.bytes_received;
        d["requests_completed"] = s.requests_completed;
        d["requests_failed"] = s.requests_failed;
        d["shm_bytes_sent"] = s.shm_bytes_sent;
        d["shm_bytes_received"] = s.shm_bytes_received;
        return d;
    }

    std::string describe() const { return ctx_ ? coh_ctx_describe(ctx_) : ""; }
    std::chrono::milliseconds timeout() const { return timeout_; }

  private:
    void live(const char *what) const
    {
        TORCH_CHECK(ctx_ != nullptr, "cohort ", what, ": the process group was destroyed");
    }

    c10::intrusive_ptr<CohortWork> work(c10d::OpType type, const char *title,
                                        std::vector<at::Tensor> outs)
    {
        live(title);
        return c10::make_intrusive<CohortWork>(getRank(), type, title, std::move(outs));
    }

    /* Start the request and hand it to the completion thread. Before a
     * collective of the whole group, a rank still in the sync schedule
     * leaves it: otherwise groups would wait for a rank that now waits in
     * the collective for them (a stall the user had to avoid by hand). */
    c10::intrusive_ptr<c10d::Work> submit(const c10::intrusive_ptr<CohortWork> &w, const char *what,
                                          const std::function<int(coh_request_t **)> &start)
    {
        if (in_schedule_.exchange(false)) {
            int st = coh_sync_leave(comm_);
            if (st < 0) fail("sync_leave", st);
        }
        coh_request_t *rq = nullptr;
        int st = start(&rq);
        if (st < 0) fail(what, st);
        w->what_ = what;
        {
            std::lock_guard<std::mutex> lk(qmu_);
            queue_.push_back({rq, w});
        }
        qcv_.notify_one();
        return w;
    }

    /* Until the request completes: the library fails it after the
     * operation timeout without progress, or at once on a lost peer. */
    static int wait_done(coh_request_t *rq)
    {
        int st;
        while ((st = coh_wait(rq, 1000)) == COH_EAGAIN) {
        }
        return st;
    }

    void progress()
    {
        std::unique_lock<std::mutex> lk(qmu_);
        for (;;) {
            qcv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) break; /* stopping, nothing left */
            Pending p = std::move(queue_.front());
            queue_.pop_front();
            lk.unlock();
            finish_one(p);
            /* The work's tensors may be Python's: freeing them takes the
             * GIL, so never under qmu_ (a thread holding the GIL may be
             * waiting for qmu_ to submit). */
            p.work.reset();
            lk.lock();
        }
    }

    static void finish_one(Pending &p)
    {
        int st = wait_done(p.req);
        std::exception_ptr err;
        if (st < 0) {
            err = std::make_exception_ptr(
                std::runtime_error(errtext(p.work->what_, st, coh_request_error(p.req))));
        } else if (p.work->after_) {
            try {
                p.work->after_();
            } catch (...) {
                err = std::current_exception();
            }
        }
        coh_request_free(p.req);
        p.work->complete(err);
    }

    void bootstrap(const c10::intrusive_ptr<c10d::Store> &store)
    {
        coh_config_t cfg;
        int st = coh_config_init(&cfg);
        if (st < 0) fail("init (environment)", st);
        cfg.rank = getRank();
        cfg.world_size = getSize();
        long long ms = timeout_.count();
        cfg.timeout_ms = ms <= 0 ? INT_MAX : (int)std::min<long long>(ms, INT_MAX);
        /* The bootstrap itself may take as long as torch lets the group form. */
        cfg.connect_timeout_ms = cfg.timeout_ms;
        std::string addr, token;
        int lfd = -1;
        const std::string key = "cohort/bootstrap";
        if (getSize() > 1) {
            if (getRank() == 0) {
                lfd = listen_any(&addr);
                token = random_token();
                std::string v = addr + " " + token;
                store->set(key, std::vector<uint8_t>(v.begin(), v.end()));
            } else {
                auto v = store->get(key);
                std::string s(v.begin(), v.end());
                auto sp = s.find(' ');
                TORCH_CHECK(sp != std::string::npos, "cohort: malformed bootstrap record '", s,
                            "'");
                addr = s.substr(0, sp);
                token = s.substr(sp + 1);
            }
            cfg.store = addr.c_str();
            cfg.token = token.c_str();
            cfg.store_fd = lfd;
        }
        st = coh_init(&cfg, &ctx_);
        if (st < 0) {
            std::string msg = errtext("init", st, coh_last_error());
            if (lfd >= 0) close(lfd);
            throw std::runtime_error(msg);
        }
        /* The context's store adopted lfd (it closes it). */
        st = coh_ctx_world(ctx_, &comm_);
        if (st < 0) fail("init", st);
    }

    /* Rank 0: a listening socket for cohort's store, on every interface, at
     * a port the kernel picks; its address as the other ranks reach it. */
    static int listen_any(std::string *addr)
    {
        const char *host = getenv("COHORT_TORCH_STORE_HOST");
        if (!host || !*host) host = getenv("MASTER_ADDR");
        if (!host || !*host) host = "127.0.0.1";
        struct addrinfo hints, *res = nullptr;
        memset(&hints, 0, sizeof(hints));
        hints.ai_socktype = SOCK_STREAM;
        int gai = getaddrinfo(host, nullptr, &hints, &res);
        TORCH_CHECK(gai == 0 && res, "cohort: cannot resolve the store host '", host,
                    "' (MASTER_ADDR or COHORT_TORCH_STORE_HOST): ", gai_strerror(gai));
        int family = res->ai_family;
        char ip[INET6_ADDRSTRLEN] = "";
        if (family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, sizeof(ip));
        else
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)res->ai_addr)->sin6_addr, ip, sizeof(ip));
        freeaddrinfo(res);
        int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_storage sa;
        memset(&sa, 0, sizeof(sa));
        socklen_t sl;
        if (family == AF_INET) {
            auto *s4 = (struct sockaddr_in *)&sa;
            s4->sin_family = AF_INET;
            s4->sin_addr.s_addr = htonl(INADDR_ANY);
            sl = sizeof(*s4);
        } else {
            auto *s6 = (struct sockaddr_in6 *)&sa;
            s6->sin6_family = AF_INET6;
            s6->sin6_addr = in6addr_any;
            sl = sizeof(*s6);
        }
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sl) != 0 || listen(fd, 1024) != 0 ||
            getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
            int e = errno;
            if (fd >= 0) close(fd);
            TORCH_CHECK(false, "cohort: cannot open the bootstrap store's socket: ", strerror(e));
        }
        int port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                           : ((struct sockaddr_in6 *)&sa)->sin6_port);
        *addr = family == AF_INET ? std::string(ip) + ":" + std::to_string(port)
                                  : "[" + std::string(ip) + "]:" + std::to_string(port);
        return fd;
    }

    static std::string random_token()
    {
        const char *env = getenv("COHORT_TOKEN");
        if (env && *env) return env;
        unsigned char raw[16];
        if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw))
            throw std::runtime_error("cohort: getrandom failed");
        static const char hex[] = "0123456789abcdef";
        std::string s;
        for (unsigned char b : raw) {
            s += hex[b >> 4];
            s += hex[b & 15];
        }
        return s;
    }

    std::chrono::milliseconds timeout_;
    coh_ctx_t *ctx_ = nullptr;
    coh_comm_t *comm_ = nullptr;
    std::atomic<bool> in_schedule_{false};
    std::mutex shutdown_mu_;
    std::mutex qmu_;
    std::condition_variable qcv_;
    std::deque<Pending> queue_;
    bool stop_ = false;
    std::thread progress_;
};

static ProcessGroupCohort *as_cohort(const c10::intrusive_ptr<c10d::ProcessGroup> &pg)
{
    auto *p = dynamic_cast<ProcessGroupCohort *>(pg.get());
    TORCH_CHECK(p, "not a cohort process group (created with backend='cohort')");
    return p;
}

static c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store> &store,
                                                     int rank, int size,
                                                     const std::chrono::duration<float> &timeout)
{
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
    py::gil_scoped_release nogil; /* the bootstrap waits for the other ranks */
    return c10::make_intrusive<ProcessGroupCohort>(store, rank, size, ms);
}

} // namespace cohort_c10d

PYBIND11_MODULE(_c10d, m)
{
    using namespace cohort_c10d;
    m.doc() = "cohort's torch.distributed backend (see cohort.torch)";
    m.def("create", &create, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
          "A cohort process group (the creator torch.distributed calls for backend 'cohort').");
    m.def(
        "sync",
        [](const c10::intrusive_ptr<c10d::ProcessGroup> &pg, at::Tensor t, uint64_t iteration,
           double weight,
           const std::string &mode) { return as_cohort(pg)->sync(t, iteration, weight, mode); },
        py::arg("pg"), py::arg("tensor"), py::arg("iteration"), py::arg("weight") = 1.0,
        py::arg("mode") = "default");
    m.def(
        "sync_leave",
        [](const c10::intrusive_ptr<c10d::ProcessGroup> &pg) { as_cohort(pg)->sync_leave(); },
        py::arg("pg"));
    m.def(
        "stats",
        [](const c10::intrusive_ptr<c10d::ProcessGroup> &pg) { return as_cohort(pg)->stats(); },
        py::arg("pg"));
    m.def(
        "describe",
        [](const c10::intrusive_ptr<c10d::ProcessGroup> &pg) { return as_cohort(pg)->describe(); },
        py::arg("pg"));
    m.def(
        "timeout",
        [](const c10::intrusive_ptr<c10d::ProcessGroup> &pg) { return as_cohort(pg)->timeout(); },
        py::arg("pg"));
    m.def(
        "shutdown",
        [](const c10::intrusive_ptr<c10d::ProcessGroup> &pg) {
            py::gil_scoped_release nogil;
            as_cohort(pg)->shutdown();
        },
        py::arg("pg"), "Cancel what still runs and close the group's connections.");
    m.def(
        "is_cohort",
        [](const c10::intrusive_ptr<c10d::ProcessGroup> &pg) {
            return dynamic_cast<ProcessGroupCohort *>(pg.get()) != nullptr;
        },
        py::arg("pg"));
}
