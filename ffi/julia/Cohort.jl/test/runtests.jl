# Tests of the Julia package in a world of one (no launcher needed):
#   COHORT_LIBRARY=build/lib/libcohort.so julia --project=ffi/julia/Cohort.jl \
#       ffi/julia/Cohort.jl/test/runtests.jl
# tools/test.sh runs them when a julia binary is on PATH.
using Test
using Cohort

for v in ("COHORT_RANK", "COHORT_WORLD_SIZE", "COHORT_STORE", "COHORT_STORE_FD", "RANK", "WORLD_SIZE")
    delete!(ENV, v)
end

@testset "Cohort.jl" begin
    ctx = Cohort.init(nics = "lo")
    @test ctx.rank == 0
    @test ctx.size == 1

    @testset "collectives, blocking" begin
        a = Float32[1, 2, 3, 4]
        r = Cohort.allreduce!(ctx, a)
        @test r["status"] == 0
        @test a == Float32[1, 2, 3, 4]
        b = collect(1:8)
        Cohort.broadcast!(ctx, b)
        @test b == collect(1:8)
        out = zeros(Float64, 3)
        Cohort.allgather!(ctx, out, [1.0, 2.0, 3.0])
        @test out == [1.0, 2.0, 3.0]
        Cohort.barrier(ctx)
    end

    @testset "Base.wait on a request (not a shadowing wait)" begin
        a = Int32[5, 6, 7]
        q = Cohort.allreduce!(ctx, a; op = "max", async = true)
        @test q isa Request
        r = wait(q)                       # Base.wait, extended
        @test r["done"] == true
        @test a == Int32[5, 6, 7]
        @test wait(q) === r               # answered once, kept
        t = @async 41 + 1                 # Base.wait on a Task still works
        wait(t)
        @test fetch(t) == 42
    end

    @testset "errors" begin
        @test_throws CohortError Cohort.call(ctx, Dict("type" => "allreduce", "dtype" => "f99"))
        @test_throws ArgumentError Cohort.allreduce!(ctx, ComplexF64[1])
        s = Cohort.stats(ctx)
        @test s["requests_completed"] >= 5
    end

    @testset "partial sync, world of one" begin
        a = Float64[2, 4]
        r = Cohort.sync!(ctx, a; iteration = 1, weight = 3)
        @test r["group"]["size"] == 1
        @test a == [2.0, 4.0]
        r = Cohort.sync!(ctx, a; iteration = 2, mode = "relay")
        @test r["group"]["full"] == true
        @test r["group"]["relays"] == []
        @test a == [2.0, 4.0]
    end

    @testset "relay allreduce, world of one" begin
        a = Int64[3, -1, 7]
        r = Cohort.allreduce!(ctx, a; op = "max", algo = "relay", iteration = 5)
        @test a == Int64[3, -1, 7]
        @test r["group"]["size"] == 1
        @test r["group"]["full"] == true
        @test r["group"]["nexcluded"] == 0
        @test_throws ArgumentError Cohort.allreduce!(ctx, a; algo = "ring")
        @test_throws CohortError Cohort.allreduce!(ctx, a; iteration = 1)  # relay only
    end

    @testset "bounded-loss allreduce, world of one" begin
        a = Float32[1, 2, 3]
        r = Cohort.allreduce!(ctx, a; loss_bound = 0.01, layer = 2, nlayers = 8)
        @test a == Float32[1, 2, 3]
        @test haskey(r, "loss")
        @test r["loss"]["push_lost_bytes"] == 0
        @test_throws ArgumentError Cohort.allreduce!(ctx, a; loss_bound = 1.5)
        @test_throws ArgumentError Cohort.allreduce!(ctx, a; loss_bound = 0.01, layer = 8,
                                                     nlayers = 8)
        @test_throws ArgumentError Cohort.allreduce!(ctx, a; layer = 1)
    end

    close(ctx)                            # Base.close, extended
    close(ctx)                            # a second close does nothing
    @test_throws CohortError Cohort.barrier(ctx)
end
