#!/usr/bin/env bash
# The prepared GPU check (issue 29): prove paralela's GPU paths on one lent NVIDIA GPU in
# one call of at most 8 minutes. docs/gpu-check.md says how to run it and what each
# check proves.
#
#   bash tools/gpu-check.sh --wheels         here, with network: download WHEELS below
#                                            into .gpu-wheels/ (at most 64 MiB)
#   bash tools/gpu-check.sh OUT              on the GPU machine: install, check, write
#                                            OUT/gpu-check.md; exit 0 when all passed
#   bash tools/gpu-check.sh --dry-run OUT    anywhere (CI): the same logic on the CPU, a
#                                            fake GPU, tiny sizes (PARALELA_GPU_CHECK_DRY=1
#                                            does the same)
#   ... --only sweep,serve OUT               some of the checks (pytest sweep launch
#                                            pipeline serve predict data)
#
# The GPU machine has Python 3.12 with a CUDA build of PyTorch and no network: paralela
# installs from this working tree over that PyTorch, with its other dependencies from the
# wheels carried in .gpu-wheels/ (`carry: [".gpu-wheels"]`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEEL_DIR="$ROOT/.gpu-wheels"
MAX_WHEEL_MIB=64

# What paralela (and its sweep and serve extras, and the tests marked gpu) needs that the
# GPU machine's image lacks (its package list: the device tool's KINDS.md): the versions
# this project's CI runs. Pure-Python packages published as sources only are built into a
# wheel here (pip wheel), the others are downloaded for CPython 3.12 on x86-64 Linux.
WHEELS=(
    optuna==5.0.0
    alembic==1.20.1
    SQLAlchemy==2.1.9
    Mako==1.4.3
    colorlog==6.12.0
    fastapi==0.165.0
    starlette==1.10.0
    pydantic==2.14.4
    pydantic_core==2.50.5
    annotated-types==0.8.0
    typing-inspection==0.4.5
    uvicorn==0.54.0
    httptools==0.9.0
    opentelemetry-api==1.45.2
    # the image has it, maybe older than pydantic's >=4.16 (its version is not known here)
    typing_extensions==4.16.0
)
# Published as sources only (pure Python): built into a wheel here.
SOURCE_WHEELS=(
    python-hostlist==2.3.0
)

# What the GPU machine's image has and the wheels above need (from its package list in
# the device tool's KINDS.md, 2026-11-17): --wheels checks the two together meet every
# requirement (tools/gpu_check/wheel_closure.py).
IMAGE_HAS=(
    torch numpy cloudpickle typer rich click shellingham psutil pyyaml httpx httpcore h11
    anyio idna certifi uvloop typing-extensions annotated-doc packaging tqdm markupsafe
    matplotlib nvidia-ml-py pygments markdown-it-py mdurl
)

download_wheels() {
    local python="${PYTHON:-python3}"
    mkdir -p "$WHEEL_DIR"
    "$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEEL_DIR" \
        --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --platform any "${WHEELS[@]}"
    "$python" -m pip wheel --quiet --no-deps --wheel-dir "$WHEEL_DIR" "${SOURCE_WHEELS[@]}"
    local count size_kib
    count=$(find "$WHEEL_DIR" -name '*.whl' | wc -l)
    size_kib=$(du -sk "$WHEEL_DIR" | cut -f1)
    local listed=$((${#WHEELS[@]} + ${#SOURCE_WHEELS[@]}))
    if [ "$count" -ne "$listed" ]; then
        echo "gpu-wheels: $WHEEL_DIR holds $count wheels, the lists have $listed:" \
             "empty it (rm -r $WHEEL_DIR) and run make gpu-wheels again" >&2
        exit 1
    fi
    if [ "$size_kib" -gt $((MAX_WHEEL_MIB * 1024)) ]; then
        echo "gpu-wheels: $WHEEL_DIR holds $((size_kib / 1024)) MiB, more than the" \
             "$MAX_WHEEL_MIB MiB a device call carries: drop wheels the image has" >&2
        exit 1
    fi
    "$python" "$ROOT/tools/gpu_check/wheel_closure.py" "$WHEEL_DIR" "$ROOT/pyproject.toml" \
        "${IMAGE_HAS[@]}"
    echo "gpu-wheels: $count wheels, $((size_kib / 1024)) MiB ($size_kib KiB) in $WHEEL_DIR"
}

install_here() {
    # Over the image's own PyTorch: --no-deps everywhere, so pip never replaces torch.
    if ! compgen -G "$WHEEL_DIR/*.whl" >/dev/null; then
        echo "gpu-check: no wheels in $WHEEL_DIR: run 'make gpu-wheels' where the network" \
             "is reachable and carry .gpu-wheels with the call" >&2
        exit 2
    fi
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-cache-dir "$WHEEL_DIR"/*.whl
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-build-isolation --no-cache-dir \
        -e "$ROOT"
}

dry=0
[ "${PARALELA_GPU_CHECK_DRY:-0}" = "1" ] && dry=1
out=""
only=()
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) download_wheels; exit 0 ;;
        --dry-run) dry=1 ;;
        --only) shift; only=(--only "${1:?--only needs a comma list of checks}") ;;
        -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}"; exit 0 ;;
        -*) echo "gpu-check: unknown option $1; valid: --wheels, --dry-run, --only" >&2; exit 2 ;;
        *) out="$1" ;;
    esac
    shift
done
if [ -z "$out" ]; then
    echo "gpu-check: give the folder for gpu-check.md: bash tools/gpu-check.sh [--dry-run] OUT" >&2
    exit 2
fi
mkdir -p "$out"

if [ "$dry" = 1 ]; then
    # The checks' logic on the CPU: paralela is already installed (CI's .venv).
    if [ -z "${PYTHON:-}" ]; then
        if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
    fi
    export GPU_CHECK_DRY=1
else
    PYTHON="${PYTHON:-python3}"
    install_here 2>&1 | tee "$out/install.log"
    export GPU_CHECK_DRY=0
fi
unset PARALELA_GPU_CHECK_DRY
export PYTHONUNBUFFERED=1
cd "$ROOT"
exec "$PYTHON" "$ROOT/tools/gpu_check/main.py" --out "$out" "${only[@]}"
