#!/bin/bash
# gpu_device.sh BUILD OUTDIR [SECONDS]: the GPU checks and figures of
# docs/gpu.md, in one run on a machine with a GPU (the lent H200), from a
# build made elsewhere (its shared libraries beside it, LD_LIBRARY_PATH).
# Steps in order of worth, each bounded; what is left when SECONDS (default
# 480) run out is skipped and said so. Each step writes OUTDIR/STEP.txt:
#   ctest_gpu   ctest -L gpu (every collective on device buffers, both paths)
#   lockprobe   gpu-lockprobe cuda (which calls wait behind a held stream)
#   gpubench    the reduction kernel against a device copy
#   bench       cohort-bench --mem device (IPC, staged) and --mem host, 2 and 4
#               ranks, beside torch.distributed's Gloo on CUDA tensors
#   mps         the same small sizes and ctest -L gpu under MPS, when the
#               daemon starts (several processes' kernels at once)
#   host_auto   the host-buffer unit and mp tests with the CUDA runtime picked
# STEPS="ctest_gpu lockprobe ..." runs those alone.
set -u
B=${1:?build dir}
O=${2:?out dir}
LIMIT=${3:-480}
T0=$(date +%s)
mkdir -p "$O"
left() { echo $((LIMIT - ($(date +%s) - T0))); }
step() { # step NAME NEED_SECONDS CMD...: run when NEED_SECONDS are left
    local name=$1 need=$2
    shift 2
    case " ${STEPS:-$name} " in *" $name "*) ;; *) return ;; esac
    local l
    l=$(left)
    if [ "$l" -lt "$need" ]; then
        echo "SKIPPED: $l s left, $need needed" >"$O/$name.txt"
        echo "== $name skipped ($l s left)"
        return
    fi
    echo "== $name ($l s left)"
    local t=$(date +%s)
    timeout -k 5 $((l - 5)) bash -c '"$@"' _ "$@" >"$O/$name.txt" 2>&1
    echo "rc=$? wall=$(($(date +%s) - t))s" >>"$O/$name.txt"
    tail -n 3 "$O/$name.txt"
}

bench_all() {
    local ranks ipc mem
    for ranks in 2 4; do
        for mem in device host; do
            for ipc in 1 0; do
                [ $mem = host ] && [ $ipc = 0 ] && continue
                echo "# cohort $ranks ranks --mem $mem COHORT_GPU_IPC=$ipc"
                COHORT_GPU=cuda COHORT_GPU_IPC=$ipc "$B/bin/cohortrun" -n $ranks --timeout 120 -- \
                    "$B/bin/cohort-bench" --mem $mem -b 4K -e 256M -f 4 -n 20 -w 5 --csv
            done
        done
        echo "# torch gloo $ranks ranks, CUDA tensors"
        python3 bench/peers/torch_bench.py --backend gloo --device cuda -n $ranks -b 4K -e 256M \
            -f 4 -i 20 -w 5
    done
}

mps_all() {
    command -v nvidia-cuda-mps-control >/dev/null || { echo "no nvidia-cuda-mps-control"; return 0; }
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    nvidia-cuda-mps-control -d || { echo "MPS did not start"; return 0; }
    local ranks ipc
    for ranks in 2 4; do
        for ipc in 1 0; do
            echo "# MPS: cohort $ranks ranks --mem device COHORT_GPU_IPC=$ipc"
            COHORT_GPU=cuda COHORT_GPU_IPC=$ipc "$B/bin/cohortrun" -n $ranks --timeout 60 -- \
                "$B/bin/cohort-bench" --mem device -b 4K -e 16M -f 4 -n 20 -w 5 --csv
        done
    done
    echo "# MPS: ctest -L gpu"
    ctest --test-dir "$B" -L gpu --output-on-failure --timeout 120
    echo quit | nvidia-cuda-mps-control
    cat $CUDA_MPS_LOG_DIRECTORY/control.log 2>/dev/null | tail -n 5
}

export B
export -f bench_all mps_all
nvidia-smi -L >"$O/env.txt" 2>&1
nvcc --version 2>/dev/null | tail -n 1 >>"$O/env.txt"
nproc >>"$O/env.txt"
step ctest_gpu 30 ctest --test-dir "$B" -L gpu --output-on-failure --timeout 120 -j2
step lockprobe 50 "$B/bin/gpu-lockprobe" cuda
step gpubench 40 env COHORT_GPU=cuda "$B/bin/cohort-gpubench" -b 1M -e 256M
step bench 150 bench_all
step mps 60 mps_all
step host_auto 60 env COHORT_GPU=auto ctest --test-dir "$B" -L "unit|mp" \
    -LE "flaky|cluster|load|soak|python|gpu|verbs" -j12 --timeout 60 --output-on-failure
echo "== done in $(($(date +%s) - T0)) s"
