"""
    Cohort

Collective communication for data-parallel training through cohort's msgpack
ABI (include/cohort_ffi.h, docs/ffi.md). `wait` and `close` extend Base's,
as Julia packages do: `using Cohort; wait(req); close(ctx)`. Tests:
test/runtests.jl (CI runs them when a julia binary is on PATH).
"""
module Cohort

using MsgPack

export CohortError, Context, Request

const libcohort = get(ENV, "COHORT_LIBRARY", "libcohort")

struct CohortError <: Exception
    status::Int
    code::String
    field::String
    message::String
end
Base.showerror(io::IO, e::CohortError) =
    print(io, "CohortError [", e.code, "] ", e.message, isempty(e.field) ? "" : " (field '$(e.field)')")

mutable struct Context
    handle::UInt64
    rank::Int
    size::Int
end

"A collective in flight; keeps its arrays rooted until it completes."
mutable struct Request
    ctx::Context
    handle::UInt64
    keep::Any
    response::Union{Nothing,Dict{Any,Any}}
end

const DTYPES = Dict{DataType,String}(Float32 => "f32", Float64 => "f64", Float16 => "f16",
                                     Int32 => "i32", Int64 => "i64", UInt8 => "u8")

dtype_name(::Type{T}) where {T} =
    haskey(DTYPES, T) ? DTYPES[T] : throw(ArgumentError("cohort: unsupported element type $T"))

# A contiguous array by address and length (zero copy).
tensor(a::Array) = Dict("addr" => UInt64(UInt(pointer(a))), "nbytes" => UInt64(sizeof(a)))

function take_response(st::Cint, resp::Ref{Ptr{UInt8}}, n::Ref{Csize_t})
    resp[] == C_NULL && throw(CohortError(st, "ENOMEM", "", "no response (out of memory)"))
    bytes = copy(unsafe_wrap(Vector{UInt8}, resp[], Int(n[])))
    ccall((:coh_ffi_free, libcohort), Cvoid, (Ptr{UInt8},), resp[])
    return MsgPack.unpack(bytes)
end

function check(r)
    st = get(r, "status", -14)
    st < 0 && throw(CohortError(st, get(r, "code", "?"), get(r, "field", ""), get(r, "error", "")))
    return r
end

"""
    init(; config...) -> Context

Create a context. Keywords are coh_config_t field names (rank, world_size,
store, token, nics, timeout_ms, ...); missing ones come from the environment.
"""
function init(; config...)
    cfg = isempty(config) ? UInt8[] : MsgPack.pack(Dict(string(k) => v for (k, v) in config))
    h = Ref{UInt64}(0)
    resp = Ref{Ptr{UInt8}}(C_NULL)
    n = Ref{Csize_t}(0)
    st = ccall((:coh_ffi_create, libcohort), Cint,
               (Ptr{UInt8}, Csize_t, Ref{UInt64}, Ref{Ptr{UInt8}}, Ref{Csize_t}),
               cfg, length(cfg), h, resp, n)
    r = check(take_response(st, resp, n))
    ctx = Context(h[], r["rank"], r["size"])
    finalizer(c -> c.handle != 0 && close(c), ctx)
    return ctx
end

function raw_call(ctx::Context, req::Dict)
    ctx.handle == 0 && throw(CohortError(-8, "ESTATE", "", "the context is finalized"))
    bytes = MsgPack.pack(req)
    resp = Ref{Ptr{UInt8}}(C_NULL)
    n = Ref{Csize_t}(0)
    st = ccall((:coh_ffi_call, libcohort), Cint,
               (UInt64, Ptr{UInt8}, Csize_t, Ref{Ptr{UInt8}}, Ref{Csize_t}),
               ctx.handle, bytes, length(bytes), resp, n)
    return take_response(st, resp, n)
end

"Send a request Dict; return the response (raises on error)."
call(ctx::Context, req::Dict) = check(raw_call(ctx, req))

function submit(ctx::Context, req::Dict, keep, async::Bool)
    req["async"] = true  # the wait happens here, in Julia, with the arrays rooted
    r = GC.@preserve keep check(raw_call(ctx, req))
    q = Request(ctx, r["request"], keep, nothing)
    return async ? q : wait(q)
end

"""
    wait(req::Request; timeout_ms=-1) -> Dict

Wait for a request; return its response or throw its error. A method of
`Base.wait`: waiting on tasks, conditions and events works as before.
"""
function Base.wait(q::Request; timeout_ms::Integer = -1)
    q.response !== nothing && return q.response
    resp = Ref{Ptr{UInt8}}(C_NULL)
    n = Ref{Csize_t}(0)
    st = GC.@preserve q ccall((:coh_ffi_wait, libcohort), Cint,
                              (UInt64, UInt64, Cint, Ref{Ptr{UInt8}}, Ref{Csize_t}),
                              q.ctx.handle, q.handle, timeout_ms, resp, n)
    r = take_response(st, resp, n)
    get(r, "status", 0) == -11 && throw(CohortError(-11, "EAGAIN", "", "not complete yet"))
    q.response = check(r)
    q.keep = nothing
    return q.response
end

"Sync modes of `sync!` and allreduce algorithms of `allreduce!` (docs/ffi.md)."
const SYNC_MODES = ("default", "allreduce", "partial", "selective", "relay")
const ALLREDUCE_ALGOS = ("default", "relay")

"""
    allreduce!(ctx, a; op="sum", async=false, algo="default", iteration=nothing)

Reduce `a` over every rank, in place. `algo="relay"` runs it as a relay group
(late ranks relay, their data is folded in when they submit; the same result,
integer data bit for bit); its response's "group" describes the group as a
sync's does (members, full, relays, relayed, phase2, phase2_method, nexcluded).
`iteration` (relay only) is the step number, for traces.

`loss_bound` > 0 (bounded loss, docs/udp.md): on rails marked udp
(`COHORT_NICS=eth0:udp`) each receive of the push stage may miss up to this
fraction of its bytes, of the pull stage `pull_loss_bound` (0: a quarter of
`loss_bound`); the response's "loss" says what was lost. `layer` of `nlayers`
sets the datagrams' DSCP priority.
"""
function allreduce!(ctx::Context, a::Array{T}; op::AbstractString = "sum", async::Bool = false,
                    algo::AbstractString = "default",
                    iteration::Union{Nothing,Integer} = nothing,
                    loss_bound::Real = 0.0, pull_loss_bound::Real = 0.0,
                    layer::Union{Nothing,Integer} = nothing,
                    nlayers::Union{Nothing,Integer} = nothing) where {T}
    algo in ALLREDUCE_ALGOS ||
        throw(ArgumentError("cohort: unknown algo \"$algo\" (one of $(join(ALLREDUCE_ALGOS, ", ")))"))
    for (name, b) in (("loss_bound", loss_bound), ("pull_loss_bound", pull_loss_bound))
        0 <= b < 1 || throw(ArgumentError("cohort: $name must be in [0, 1) ($b)"))
    end
    req = Dict{String,Any}("type" => "allreduce", "dtype" => dtype_name(T), "op" => op,
                           "buf" => tensor(a))
    algo == "default" || (req["algo"] = algo)
    iteration === nothing || (req["iteration"] = iteration)
    if loss_bound > 0 || pull_loss_bound > 0
        req["loss_bound"] = Float64(loss_bound)
        req["pull_loss_bound"] = Float64(pull_loss_bound)
    end
    if nlayers !== nothing
        nlayers >= 1 || throw(ArgumentError("cohort: nlayers must be >= 1 ($nlayers)"))
        l = layer === nothing ? 0 : layer
        0 <= l < nlayers || throw(ArgumentError("cohort: layer $l of $nlayers"))
        req["nlayers"] = nlayers
        req["layer"] = l
    elseif layer !== nothing
        throw(ArgumentError("cohort: layer needs nlayers"))
    end
    submit(ctx, req, a, async)
end

function broadcast!(ctx::Context, a::Array{T}; root::Integer = 0, async::Bool = false) where {T}
    submit(ctx, Dict("type" => "broadcast", "dtype" => dtype_name(T), "root" => root,
                     "buf" => tensor(a)), a, async)
end

"out (size × length(input)) = every rank's input in rank order; input=nothing: in place."
function allgather!(ctx::Context, out::Array{T}, input::Union{Nothing,Array{T}} = nothing;
                    async::Bool = false) where {T}
    req = Dict{String,Any}("type" => "allgather", "dtype" => dtype_name(T), "recv" => tensor(out))
    input === nothing || (req["send"] = tensor(input))
    submit(ctx, req, (out, input), async)
end

function reduce_scatter!(ctx::Context, out::Array{T}, input::Union{Nothing,Array{T}} = nothing;
                         op::AbstractString = "sum", async::Bool = false) where {T}
    req = Dict{String,Any}("type" => "reduce_scatter", "dtype" => dtype_name(T), "op" => op,
                           "recv" => tensor(out))
    input === nothing || (req["send"] = tensor(input))
    submit(ctx, req, (out, input), async)
end

barrier(ctx::Context; async::Bool = false) = submit(ctx, Dict("type" => "barrier"), nothing, async)

"Partial / selective / relay synchronisation of `a` (in place) for step `iteration`; mode: one of SYNC_MODES."
function sync!(ctx::Context, a::Array{T}; iteration::Integer, weight::Real = 1.0,
               mode::Union{Nothing,AbstractString} = nothing, async::Bool = false) where {T}
    req = Dict{String,Any}("type" => "sync", "dtype" => dtype_name(T), "buf" => tensor(a),
                           "iteration" => iteration, "weight" => Float64(weight))
    mode === nothing || (req["mode"] = mode)
    submit(ctx, req, a, async)
end

sync_leave(ctx::Context) = call(ctx, Dict("type" => "sync_leave"))
stats(ctx::Context) = call(ctx, Dict("type" => "stats"))["stats"]
"The rail balancer's newest table as text (EUNSUPPORTED with one rail)."
lb_table(ctx::Context) = call(ctx, Dict("type" => "lb_table"))["table"]
failed_ranks(ctx::Context) = Vector{Int}(call(ctx, Dict("type" => "failed_ranks"))["ranks"])
probe(ctx::Context) = call(ctx, Dict("type" => "probe"))

"The descriptor that becomes readable when a request completes (for event loops)."
function event_fd(ctx::Context)
    fd = Ref{Cint}(-1)
    st = ccall((:coh_ffi_event_fd, libcohort), Cint, (UInt64, Ref{Cint}), ctx.handle, fd)
    st < 0 && throw(CohortError(st, "?", "context", "coh_ffi_event_fd failed"))
    return fd[]
end

"""
    close(ctx::Context)

Finalize the context: requests still running are canceled. A second call does
nothing. A method of `Base.close`; a context that is garbage-collected is
closed by its finalizer.
"""
function Base.close(ctx::Context)
    ctx.handle == 0 && return nothing
    h = ctx.handle
    ctx.handle = 0
    resp = Ref{Ptr{UInt8}}(C_NULL)
    n = Ref{Csize_t}(0)
    st = ccall((:coh_ffi_destroy, libcohort), Cint, (UInt64, Ref{Ptr{UInt8}}, Ref{Csize_t}),
               h, resp, n)
    check(take_response(st, resp, n))
    return nothing
end

end # module
