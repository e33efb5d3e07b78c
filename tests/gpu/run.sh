#!/usr/bin/env bash
# tests/gpu/run.sh: the real-GPU checks of issue 8 (compute shares, priority, oversubscription)
# in ONE call of under 8 minutes, on a machine with an NVIDIA card and its driver.
#
# Needs: the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1), Python 3 (3.10+), and gcc +
# make to build the interposer (without them, carry a prebuilt libinterpose/build: the run
# tool's `carry: ["libinterpose/build"]`; it needs a glibc at least as new as where it was
# built). No CUDA toolkit: the interposer builds from its own headers, and the PyTorch-free
# checks JIT-compile a tiny PTX kernel through the driver.
# PyTorch is optional: if `import torch` fails and wheels were carried in .whl/ (torch and
# its dependencies, e.g. `pip download torch --dest .whl` on a machine with the same Python),
# they are installed into a throw-away venv (offline). Without torch the torch checks (the
# 4096x4096 matmul split, the trainer beside a latency loop, FC-02 expandable segments,
# mem_get_info) are reported as skipped; everything else still runs.
#
# Measures (one process per share, each under LD_PRELOAD with its own config file):
#   FC-13  caps 10/30/50/70/90 with 50 us and 20 ms kernels; the 30:70 split (PTX, torch)
#   FC-14  a high-priority small-kernel loop (p50/p99 latency) alone and beside a
#          low-priority loop / trainer, and the low side's throughput and pauses
#   FC-15  an oversubscribed share allocating to its cap (card memory + 8 GiB)
#   FC-16  cuMemGetInfo / NVML / torch.cuda.mem_get_info against a 12288 MiB share
#   FC-02  PyTorch with expandable_segments:True under a 4096 MiB share
#   overhead: launch rate of an uncapped share vs no interposer (and matmul throughput),
#          of an uncapped high-priority share beside a low-priority one (watched), and of a
#          capped share on a loop of the smallest kernels (the gated path, issue 17)
#   graphs CUDA graph capture under a 30% share (GLOBAL mode, the gate's poller running) and
#          capped replay; torch.cuda.graph likewise
#   driver paths (seconds): what the interposer assumes of the real driver, each printed and
#          recorded (figures.json "driver_paths") as pass / fail / skip with why:
#          vmm_import   cuMemCreate (POSIX fd) under a share, two exports, the second imported
#                       in the same process: charged the whole size (the interposer sizes it by
#                       trial mappings, cuMemAddressReserve + partial cuMemMap, which a process
#                       without the interposer also tries: part maps, past the end fails), and
#                       all of it given back at release
#          pool_cap     cuMemAllocAsync past a 1024 MiB share, release threshold at max: refused
#                       with OUT_OF_MEMORY within the share; NVML's figure for the process too
#          pool_destroy a pool destroyed with a live allocation keeps its charge (and the driver
#                       its memory) until the allocation is freed
#          heap_limit   cuCtxSetLimit(MALLOC_HEAP_SIZE) growth charged; past the share
#                       OUT_OF_MEMORY with the limit unchanged; lowered: given back
#          nvml_procs   nvmlDeviceGetComputeRunningProcesses_v3 inside a share lists itself and
#                       its share's other process, not a co-tenant's that the driver lists
# Writes $OUT/figures.json (OUT defaults to ./out), prints a table, and ends with
#   cap_error_pts=N split_30_70=N:N hiprio_p99_ratio=N uncapped_overhead_pct=N
set -u -o pipefail
T0=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
LOG="$OUT/run.log"
: > "$LOG"
say() { echo "[run.sh $(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
na_line() { echo "cap_error_pts=NA split_30_70=NA:NA hiprio_p99_ratio=NA uncapped_overhead_pct=NA"; }

say "machine: $(uname -srm), $(nproc) cores; python: $(command -v python3) $(python3 -V 2>&1)"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
    nvidia-smi --query-compute-apps=pid,name --format=csv,noheader 2>&1 | tee -a "$LOG"
else
    say "nvidia-smi not found (continuing: the driver library is what matters)"
fi
if ! python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>>"$LOG"; then
    say "FATAL: libcuda.so.1 cannot be loaded: no NVIDIA driver here"
    na_line
    exit 2
fi

LIBSO=libinterpose/build/libegpu_interpose.so
if command -v gcc >/dev/null && command -v make >/dev/null; then
    say "building libinterpose"
    if ! make -C libinterpose -j"$(nproc)" build/libegpu_interpose.so >>"$LOG" 2>&1; then
        say "the build failed (tail of $LOG below); a carried $LIBSO is used if present"
        tail -30 "$LOG"
    fi
else
    say "no gcc/make here: using a carried $LIBSO if there is one"
fi
if [ ! -f "$LIBSO" ]; then
    say "FATAL: no interposer library (build it here, or carry libinterpose/build)"
    na_line
    exit 3
fi

PY=python3
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        say "installing PyTorch from .whl/ (offline, into /tmp/egpu-gpu-venv)"
        if python3 -m venv --system-site-packages /tmp/egpu-gpu-venv >>"$LOG" 2>&1 &&
            timeout 200 /tmp/egpu-gpu-venv/bin/pip install -q --no-index --find-links .whl torch >>"$LOG" 2>&1; then
            PY=/tmp/egpu-gpu-venv/bin/python
        else
            say "PyTorch install failed; torch checks will be skipped (see $LOG)"
        fi
    else
        say "no PyTorch and no .whl/: torch checks will be skipped"
    fi
fi
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null | tee -a "$LOG"

LEFT=$(( 460 - ( $(date +%s) - T0 ) ))
BUDGET=$(( LEFT - 70 ))
[ "$BUDGET" -lt 60 ] && BUDGET=60
say "running the checks (budget ${BUDGET}s, hard stop ${LEFT}s)"
# EGPU_GPU_SUITE_ARGS: extra suite.py arguments (tests of this script on a CPU machine use
# "--fake --scale 0.2 --only fc16" with the fake driver on LD_LIBRARY_PATH)
# shellcheck disable=SC2086
timeout --kill-after=10 "$LEFT" "$PY" tests/gpu/suite.py --out "$OUT" --budget "$BUDGET" ${EGPU_GPU_SUITE_ARGS:-} \
    2>>"$LOG" | tee "$OUT/suite.log"
RC=${PIPESTATUS[0]}
if ! tail -1 "$OUT/suite.log" | grep -q '^cap_error_pts='; then
    say "the checks did not finish (rc=$RC); partial figures in $OUT/figures.json"
    na_line
fi
say "done in $(( $(date +%s) - T0 ))s"
exit 0
