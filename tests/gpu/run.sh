#!/bin/sh
# tests/gpu/run.sh -- the GPU checks, for a machine with an NVIDIA GPU (made
# for one H200; about 2-4 minutes, under 5). Run from anywhere:
#
#     sh tests/gpu/run.sh
#
# Without a GPU it says so in one line and exits 77; the CPU suite, with
# the same CUDA code on the dummy device (tests/dummy), is `make test`.
#
# 0. preflight: what it found (make, the C compiler, nvcc, cuBLAS's header
#    and libraries, compute-sanitizer, the GPU and its driver); cuBLAS is
#    looked for where nvcc looks, then in CUDA_HOME, /usr/local/cuda, the
#    loader's cache and a Python wheel (nvidia-cublas-cu*), and passed to
#    the build with -I, -L and an rpath when nvcc would not find it;
# 1. builds the library and the CUDA sources (make lib cuda; -fmad=false
#    -lineinfo) and, apart, the CPU tests of their plain-C half (the arena)
#    and of cuda/ on the dummy device, which run without stopping the GPU
#    checks when they fail (a compiler warning under -Werror, no libasan);
# 2. the CUDA trainer on a tiny GPT-2: GPU against the CPU reference per
#    parameter tensor (--check-cpu), freed buffers poisoned (--poison),
#    with and without dropout, with and without in-place backwards, at
#    100/50/33 %/min budgets, every plan's gradients bit for bit the
#    baseline's and its measured peak the simulated one;
# 2b. its stage mode (build/gpt2_cuda_mpi, when MPI is installed) under
#    mpirun on this GPU: P = 1, and P = 2 ranks sharing it (1F1B and GPipe,
#    MPI through pinned host memory); NCCL between two GPUs when there are
#    two; each run bit for bit against the single-process trainer on the
#    device, every rank's measured peak its stage plan's;
# 3. compute-sanitizer (memcheck, racecheck) on a tiny run, when it exists;
# 4. the CUDA trainer on the GPT-2 124M shape (12 layers, C=768, 12 heads,
#    B=8, T=1024, backwards in place) at 100, 50 and 33 % of the baseline
#    peak and at the smallest budget the planner meets ("min"): per budget
#    the measured peak (the arena's), the simulated peak, the arena, the
#    measured step time, the predicted and measured overhead, and the
#    gradient check (loss and every parameter gradient bitwise against the
#    baseline plan). On this shape 33 % is below what any plan can do: the
#    softmax backward alone holds the probabilities, their gradient and the
#    logits' gradient (3 x 1.65 GB, 33.7 % of the 14.66 GB baseline peak:
#    the graph's lower bound).
# Without lp_solve the library is built without the solver (OMIT=1) and the
# trainer's default algorithm, rockmate, plans without its ILP options.
#
# Exit status: 0 every step passed; 77 no GPU; 78 a GPU but no way to
# build for it (make, cc, nvcc or cuBLAS missing); else the first failed
# step's status.
set -u
cd "$(dirname "$0")/../.." || exit 2
BUILD=${BUILD:-build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
status=0

step() { echo; echo "== $*"; }
run() { # run CMD... with a time limit; remember the first failure
    timeout "${LIMIT:-240}" "$@"
    rc=$?
    [ $rc -ne 0 ] && echo "-- FAILED ($rc): $*" && [ $status -eq 0 ] && status=$rc
    return $rc
}

# The GPU first: without one there is nothing to do here.
command -v nvidia-smi >/dev/null 2>&1 || PATH=$PATH:/usr/lib/wsl/lib:/usr/local/nvidia/bin
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
if [ -z "$gpu" ]; then
    echo "tests/gpu/run.sh: no NVIDIA GPU here (nvidia-smi $(command -v nvidia-smi >/dev/null 2>&1 && echo 'lists none' || echo 'not found')): nothing to run; make test runs the CUDA code on the dummy device"
    exit 77
fi

step "preflight"
missing=
found() { printf '%-18s %s\n' "$1:" "$2"; }
for t in make "${CC:-cc}"; do
    if command -v "$t" >/dev/null 2>&1; then found "$t" "$(command -v "$t")"; else found "$t" "NOT FOUND"; missing="$missing $t"; fi
done
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || true)}
[ -z "$NVCC" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
if [ -n "$NVCC" ]; then
    found nvcc "$NVCC ($("$NVCC" --version 2>&1 | tail -n 1))"
else
    found nvcc "NOT FOUND (PATH, CUDA_HOME, /usr/local/cuda/bin)"
    missing="$missing nvcc"
fi
found GPU "$gpu (name, memory, driver)"
found "CUDA (driver)" "$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)"

# cuBLAS: the header and libcublas + libcublasLt. Where nvcc looks needs no
# flags; anywhere else gets -I, -L and an rpath (a wheel's libraries have
# only versioned names, so -L points at links made in $BUILD).
toolkit=
[ -n "$NVCC" ] && toolkit=$(dirname "$(dirname "$NVCC")")
cublas_inc='' cublas_lib='' cublas_where=''
for d in "$toolkit" "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [ -n "$d" ] || continue
    for i in "$d/include" "$d"/targets/*/include; do
        [ -z "$cublas_inc" ] && [ -f "$i/cublas_v2.h" ] && cublas_inc=$i
    done
    for l in "$d/lib64" "$d/lib" "$d"/targets/*/lib; do
        [ -z "$cublas_lib" ] && ls "$l"/libcublas.so* >/dev/null 2>&1 && cublas_lib=$l && cublas_where=$d
    done
done
if [ -z "$cublas_lib" ]; then # the loader's cache (a distribution's package)
    l=$(ldconfig -p 2>/dev/null | sed -n 's/.*libcublas\.so[.0-9]* .*=> \(.*\)/\1/p' | head -n 1)
    [ -n "$l" ] && cublas_lib=$(dirname "$l") && cublas_where="the loader's cache"
fi
[ -z "$cublas_inc" ] && [ -f /usr/include/cublas_v2.h ] && cublas_inc=/usr/include
if [ -z "$cublas_lib" ] || [ -z "$cublas_inc" ]; then # a Python wheel (pip install nvidia-cublas-cu12)
    w=$(python3 -c 'import os, nvidia.cublas as c; print(os.path.dirname(c.__file__))' 2>/dev/null ||
        python3 -c 'import os, nvidia.cublas as c; print(list(c.__path__)[0])' 2>/dev/null)
    if [ -n "$w" ]; then
        [ -z "$cublas_inc" ] && [ -f "$w/include/cublas_v2.h" ] && cublas_inc=$w/include
        [ -z "$cublas_lib" ] && ls "$w"/lib/libcublas.so* >/dev/null 2>&1 && cublas_lib=$w/lib && cublas_where="a Python wheel"
    fi
fi
CUDA_CFLAGS='' CUDA_LDFLAGS=''
if [ -n "$cublas_inc" ] && [ -n "$cublas_lib" ]; then
    found "cuBLAS" "$cublas_lib ($cublas_where), header in $cublas_inc"
    [ -n "$toolkit" ] && [ "$cublas_inc" != "$toolkit/include" ] && case "$cublas_inc" in
        "$toolkit"/targets/*) ;;
        *) CUDA_CFLAGS="-I$cublas_inc" ;;
        esac
    case "$cublas_lib" in
    "$toolkit"/lib64 | "$toolkit"/targets/*) ;;
    *)
        links=$BUILD/cublas-links
        mkdir -p "$links"
        for n in cublas cublasLt; do
            f=$(ls "$cublas_lib"/lib$n.so "$cublas_lib"/lib$n.so.* 2>/dev/null | head -n 1)
            [ -n "$f" ] && ln -sf "$f" "$links/lib$n.so"
        done
        CUDA_LDFLAGS="-L$links -Xlinker -rpath=$cublas_lib"
        ;;
    esac
    [ -n "$CUDA_CFLAGS$CUDA_LDFLAGS" ] && found "  passed as" "CUDA_CFLAGS='$CUDA_CFLAGS' CUDA_LDFLAGS='$CUDA_LDFLAGS'"
else
    found "cuBLAS" "NOT FOUND (header: ${cublas_inc:-none}, libraries: ${cublas_lib:-none}; looked in nvcc's toolkit, CUDA_HOME, /usr/local/cuda, ldconfig, python3's nvidia.cublas)"
    missing="$missing cuBLAS"
fi
sanitizer=$(command -v compute-sanitizer 2>/dev/null || true)
[ -z "$sanitizer" ] && [ -n "$toolkit" ] && [ -x "$toolkit/bin/compute-sanitizer" ] && sanitizer=$toolkit/bin/compute-sanitizer
found compute-sanitizer "${sanitizer:-not found (step 3 skipped)}"

# Without lp_solve the library builds without the solver: the trainer's
# default algorithm, rockmate, then plans without its ILP options.
OMIT=0
case "$(${CC:-cc} -print-file-name=liblpsolve55.a 2>/dev/null)" in
/*) found lp_solve "yes" ;;
*) found lp_solve "not found: building with OMIT=1 (rockmate plans without its ILP options)"; OMIT=1 ;;
esac
if [ -n "$missing" ]; then
    echo "tests/gpu/run.sh: cannot build for the GPU, missing:$missing"
    exit 78
fi

step "build (make lib cuda)"
LIMIT=200 run make -j"$JOBS" OMIT=$OMIT BUILD="$BUILD" NVCC="$NVCC" CUDA_CFLAGS="$CUDA_CFLAGS" \
    CUDA_LDFLAGS="$CUDA_LDFLAGS" lib cuda || exit $status
[ -x "$BUILD/gpt2_cuda" ] || { echo "-- FAILED: $BUILD/gpt2_cuda was not built"; exit 1; }
if ldd "$BUILD/gpt2_cuda" 2>/dev/null | grep -q 'not found'; then
    echo "-- FAILED: $BUILD/gpt2_cuda cannot load:"
    ldd "$BUILD/gpt2_cuda" | grep 'not found'
    exit 1
fi

step "CPU tests: the arena, and cuda/ on the dummy device (apart: their failure stops nothing)"
if LIMIT=200 run make -j"$JOBS" OMIT=$OMIT BUILD="$BUILD" "$BUILD/tests/test_arena" "$BUILD/tests/test_cuda"; then
    LIMIT=60 run "$BUILD/tests/test_arena"
    LIMIT=60 run "$BUILD/tests/test_cuda"
fi

G=$BUILD/gpt2_cuda
# $tiny and $small are split into words on purpose.
tiny="--preset tiny --check-cpu --poison --budgets 100,50,33,min --steps 3 --profile-runs 3"
step "tiny GPT-2: GPU vs CPU reference, plans vs baseline"
LIMIT=60 run "$G" $tiny
step "tiny GPT-2, backwards in place"
LIMIT=60 run "$G" $tiny --inplace 1
step "tiny GPT-2 with dropout 0.1 (recomputed masks)"
LIMIT=60 run "$G" $tiny --dropout 0.1
step "tiny GPT-2 with dropout 0.1, backwards in place"
LIMIT=60 run "$G" $tiny --dropout 0.1 --inplace 1
step "tiny GPT-2 offloading over a 25 GB/s link (copy streams, pinned memory, events)"
LIMIT=60 run "$G" $tiny --dropout 0.1 --copy 25e9

# The stage mode (examples/gpt2_cuda_pipe.cuh) on this one GPU: ranks under
# mpirun, each checking its losses and gradients bit for bit against the
# single-process trainer on the device and its measured peak against its
# stage plan's. One rank (P = 1: the phases, the micro-batches' slots; NCCL's
# init where the build has NCCL), and two ranks sharing the GPU with the
# tensors through pinned host memory over MPI (NCCL refuses two ranks on one
# GPU); with two GPUs or more, two ranks over NCCL as well.
M=$BUILD/gpt2_cuda_mpi
if command -v mpirun >/dev/null 2>&1 && command -v mpicxx >/dev/null 2>&1; then
    mpi_flags="--oversubscribe"
    [ "$(id -u)" = 0 ] && mpi_flags="$mpi_flags --allow-run-as-root"
    # $mpi_flags and $stage are split into words on purpose.
    stage="--preset tiny --micro-batches 4 --steps 2 --profile-runs 3 --poison --dropout 0.1"
    if [ -x "$M" ]; then
        step "stage mode, one rank on the GPU (P = 1)"
        LIMIT=120 run mpirun $mpi_flags -np 1 "$M" $stage
        step "stage mode, P = 2 ranks sharing the GPU, 1F1B, backwards in place, MPI through pinned host memory"
        LIMIT=120 run mpirun $mpi_flags -np 2 "$M" $stage --inplace 1 --transport mpi
        step "stage mode, P = 2 ranks sharing the GPU, GPipe, MPI through pinned host memory"
        LIMIT=120 run mpirun $mpi_flags -np 2 "$M" $stage --schedule gpipe --transport mpi
        ngpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
        if [ "$ngpu" -ge 2 ] && grep -q ncclSend "$M" 2>/dev/null; then
            step "stage mode, P = 2 ranks on two GPUs, 1F1B, NCCL"
            LIMIT=120 run mpirun $mpi_flags -np 2 "$M" $stage --transport nccl
        fi
    else
        echo "-- FAILED: $M was not built (mpicxx is there: make cuda builds it)"
        [ $status -eq 0 ] && status=1
    fi
else
    step "stage mode: NOT RUN, mpirun or mpicxx not found (Debian: libopenmpi-dev openmpi-bin)"
fi

if [ -n "$sanitizer" ]; then
    small="--preset tiny --poison --budgets 50 --steps 1 --warmup 0 --profile-runs 1 --inplace 1 --dropout 0.1"
    step "compute-sanitizer memcheck, tiny"
    LIMIT=120 run "$sanitizer" --tool memcheck --error-exitcode 9 "$G" $small
    step "compute-sanitizer racecheck, tiny"
    LIMIT=120 run "$sanitizer" --tool racecheck --error-exitcode 9 "$G" $small
fi

step "GPT-2 124M shape, B=8 T=1024, budgets 100/50/33 %/min"
LIMIT=200 run "$G" --preset 124M --inplace 1 --budgets 100,50,33,min --steps 5 --profile-runs 5
step "GPT-2 124M shape offloading over H200 PCIe 5.0 (~50 GB/s each way), budgets 50/33 %"
LIMIT=200 run "$G" --preset 124M --inplace 1 --budgets 50,33 --steps 5 --profile-runs 5 --copy 50e9

step "result"
[ $status -eq 0 ] && echo "all GPU checks passed" || echo "GPU checks FAILED (first status $status)"
exit $status
