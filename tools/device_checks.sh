#!/usr/bin/env bash
# GPU checks for an offline CUDA machine: installs .whl/ (plus this tree's sources) into /tmp/site, then runs the NVML
# check, the gpu-marked tests and the tree-merge and actor-decode benches on CUDA. Usage: bash tools/device_checks.sh
# (ONLY="tree-bench actor-bench" runs just those steps after the install).
# .whl/ holds this project's wheel (`pip wheel --no-deps --no-build-isolation -w .whl .`) and py3.12 manylinux wheels
# (`pip download --no-deps --only-binary=:all: --python-version 3.12 ...`) of what the machine lacks: grpcio and
# protobuf at the stubs' versions, grpcio-health-checking/-reflection, pyzmq, lmdb, openai and its needs.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/device-checks}
mkdir -p "$OUT"
DEADLINE=$((SECONDS + ${BUDGET_S:-340}))   # every step's timeout is cut to what is left of this budget

step() {   # step NAME SECONDS COMMAND...: runs COMMAND under a timeout, records its exit code (124: timed out)
    local name=$1 limit=$2 left=$((DEADLINE - SECONDS)) rc
    shift 2
    if [[ -n ${ONLY:-} && $name != install && $name != sources && " $ONLY " != *" $name "* ]]; then return; fi
    ((left < limit)) && limit=$left
    echo -e "\n=== $name (timeout ${limit}s): $*"
    if ((limit < 5)); then rc=skipped; else timeout -k 10 "$limit" "$@"; rc=$?; fi
    echo "=== $name: rc=$rc"
    SUMMARY+=("$(printf '%-12s rc=%s' "$name" "$rc")")
}

main() {
    SUMMARY=()
    # A venv without pip (uv) runs pip from its own wheel. The wheel of forge-rl brings the console scripts; the
    # tree's sources are then copied over it (the package-dir layout of pyproject.toml) so a stale wheel can't matter.
    PIP="python3 -m pip"
    $PIP --version >/dev/null 2>&1 || PIP="python3 $(ls .whl/pip/pip-*.whl)/pip"
    step install 120 $PIP install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl
    step sources 30 bash -c 'cp -r forge/. /tmp/site/forge/ && cp -r protos/forge/v1/. /tmp/site/forge/v1/ &&
        for d in learner actors gateway cache; do cp -r $d/. /tmp/site/forge/$d/ || exit 1; done'
    # PYTHONSAFEPATH: `python -m` must not put the repository root (whose forge/ lacks forge.v1 etc.) on sys.path.
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
    step gpu-info 60 bash -c 'nvidia-smi; python3 -c "import forge, grpc, google.protobuf as pb, openai, zmq, lmdb
print(forge.__file__, \"grpcio\", grpc.__version__, \"protobuf\", pb.__version__)
import torch; print(torch.__version__, torch.cuda.get_device_name())"'
    step nvml 60 python3 tests/gpu/check_nvml.py
    step pytest-gpu 120 python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors
    step tree-bench 150 python3 bench/tree_merge.py --device cuda --impl flex --groups 4,16 --turns 1,8,32 \
        --system 2048 --repeats 2 --linear-cap 100000 --json "$OUT/tree.json"
    step actor-bench 150 python3 bench/actor_decode.py --device cuda --batches 1,8,32,64 --repeats 2 \
        --sections decode,prefix,speculative,swap
    echo -e "\n=== summary (rc 124: timed out), $SECONDS s in all"
    printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
}

main 2>&1 | tee "$OUT/checks.log"
