"""The shell functions of a Forge batch script: start a service as a named job step, find each node's address, wait
for a service (bounded, failing with its last log lines), fetch a model into every node's cache, and stop the services with a signal they receive.

A step is stopped with ``scancel --signal=TERM JOB.STEP``, which Slurm delivers to the step's tasks: signalling the
``srun`` instead makes Slurm kill the task outright, so the learner would lose the steps since its last checkpoint.
The script reads READY_TIMEOUT, STOP_TIMEOUT, INTERFACE, LOGS and SLURM_JOB_ID."""

HELPERS = r'''
PIDS=()
NAMES=()

# start NAME NODE COMMAND...: run COMMAND as the job step NAME on NODE, in the background; its output goes to
# $LOGS/NAME.log.
start() {
    local name=$1 node=$2
    shift 2
    srun --job-name="$name" --nodes=1 --ntasks=1 --nodelist="$node" --overlap --kill-on-bad-exit=0 \
        --output="$LOGS/$name.log" "$@" &
    PIDS+=("$!")
    NAMES+=("$name")
    echo "started $name on $node (log: $LOGS/$name.log)"
}

# address NODE: the address the other nodes reach NODE at: its IPv4 address on $INTERFACE when set, else the
# address Slurm knows it by (NodeAddr), so nothing depends on the node's name resolving.
address() {
    local found
    if [ -n "$INTERFACE" ]; then
        found=$(srun --nodes=1 --ntasks=1 --nodelist="$1" --overlap ip -4 -o addr show dev "$INTERFACE" \
                | awk '{split($4, a, "/"); print a[1]; exit}')
    else
        found=$(scontrol show node "$1" | tr ' ' '\n' | awk -F= '$1 == "NodeAddr" {print $2; exit}')
    fi
    if [ -z "$found" ]; then
        echo "no address for node $1${INTERFACE:+ on interface $INTERFACE}" >&2
        exit 1
    fi
    echo "$found"
}

# fetch_model MODEL: fetch MODEL (a Hugging Face id) into the Hugging Face cache of every node of the job, one
# fetch a node, all at once; the job fails with the fetch's last lines where one fails.
fetch_model() {
    local node k pids=() nodes=()
    for node in $(printf '%s\n' "${NODES[@]}" | sort -u); do
        srun --job-name=fetch --nodes=1 --ntasks=1 --nodelist="$node" --overlap --output="$LOGS/fetch-$node.log" \
            forge model fetch "$1" &
        pids+=("$!")
        nodes+=("$node")
    done
    for k in "${!pids[@]}"; do
        if ! wait "${pids[k]}"; then
            echo "fetching $1 on ${nodes[k]} failed; the last lines of $LOGS/fetch-${nodes[k]}.log:" >&2
            tail -n 20 "$LOGS/fetch-${nodes[k]}.log" >&2 || true
            exit 1
        fi
    done
    echo "$1 is in the cache of every node"
}

# alive NAME: whether the step NAME still runs.
alive() {
    local k
    for k in "${!NAMES[@]}"; do
        if [ "${NAMES[k]}" = "$1" ]; then
            kill -0 "${PIDS[k]}" 2>/dev/null
            return
        fi
    done
    return 1
}

# fail NAME WHY: say why NAME failed, with the errors its log names (a torchrun job's come long before its last lines)
# and the last lines of its log; stop everything; end the job with status 1.
fail() {
    local errors
    errors=$(grep -E '^(Error: |[A-Za-z_.]*(Error|Exception): )' "$LOGS/$1.log" 2>/dev/null | head -n 5 || true)
    [ -z "$errors" ] || printf '%s %s: %s\n' "$1" "$2" "$errors" >&2
    echo "$1 $2; the last lines of $LOGS/$1.log:" >&2
    tail -n 20 "$LOGS/$1.log" >&2 || true
    stop_all
    exit 1
}

# wait_file NAME FILE: wait until the service NAME has written its ready file FILE, at most READY_TIMEOUT seconds.
wait_file() {
    local until=$((SECONDS + READY_TIMEOUT))
    until [ -s "$2" ]; do
        alive "$1" || fail "$1" "stopped before it was ready"
        [ "$SECONDS" -lt "$until" ] || fail "$1" "was not ready after ${READY_TIMEOUT}s"
        sleep 1
    done
    echo "$1 is ready"
}

# wait_port NAME HOST PORT: wait until the service NAME accepts connections on HOST:PORT, at most READY_TIMEOUT
# seconds.
wait_port() {
    local until=$((SECONDS + READY_TIMEOUT))
    until timeout 5 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; do
        alive "$1" || fail "$1" "stopped before it was ready"
        [ "$SECONDS" -lt "$until" ] || fail "$1" "did not listen on $2:$3 after ${READY_TIMEOUT}s"
        sleep 1
    done
    echo "$1 is ready"
}

# ended_others: whether a step other than the rollout drivers has ended.
ended_others() {
    local k
    for k in "${!NAMES[@]}"; do
        [[ ${NAMES[k]} == rollout* ]] && continue
        kill -0 "${PIDS[k]}" 2>/dev/null || return 0
    done
    return 1
}

# rollouts_running: whether a rollout driver still runs.
rollouts_running() {
    local k
    for k in "${!NAMES[@]}"; do
        [[ ${NAMES[k]} == rollout* ]] && kill -0 "${PIDS[k]}" 2>/dev/null && return 0
    done
    return 1
}

# this_start: whether the job is still in this start of it. Slurm requeues a job whose node is lost by itself and
# may start it again while this script, the earlier start's, still stops its services: the steps of the same names
# and a requeue are then the new start's, not this script's to touch. Where Slurm does not answer, it is.
this_start() {
    local info
    info=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null) || return 0
    [[ " $info " == *" Restarts=${SLURM_RESTART_COUNT:-0} "* ]]
}

# steps_now: the job's steps as Slurm lists them, "JOB.STEP NAME" a line (asked once, then looked up in); none once
# the job has started again (this script's steps are then stopped through their srun).
steps_now() {
    this_start || return 0
    squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' 2>/dev/null || true
}

# step_in STEPS NAME: the step id (JOB.STEP) of the step NAME in the list STEPS.
step_in() {
    awk -v name="$2" '$2 == name {print $1; exit}' <<<"$1"
}

# stop_all: SIGTERM to every step, the rollout drivers first and the pool last, each group at once (the learner's
# ranks stop together), waiting up to STOP_TIMEOUT seconds for each group to end before killing what is left.
stop_all() {
    trap '' TERM INT
    local group k step steps until
    for group in rollout gateway actor learner teacher cache pool; do
        steps=$(steps_now)
        for k in "${!NAMES[@]}"; do
            [[ ${NAMES[k]} == "$group"* ]] && kill -0 "${PIDS[k]}" 2>/dev/null || continue
            step=$(step_in "$steps" "${NAMES[k]}")
            if [ -n "$step" ]; then
                scancel --signal=TERM "$step" 2>/dev/null || true
            else                            # Slurm does not answer: srun passes it on, less gently
                kill -TERM "${PIDS[k]}" 2>/dev/null || true
            fi
        done
        until=$((SECONDS + STOP_TIMEOUT))
        for k in "${!NAMES[@]}"; do
            [[ ${NAMES[k]} == "$group"* ]] || continue
            while kill -0 "${PIDS[k]}" 2>/dev/null && [ "$SECONDS" -lt "$until" ]; do sleep 1; done
            if kill -0 "${PIDS[k]}" 2>/dev/null; then
                echo "${NAMES[k]} did not stop within ${STOP_TIMEOUT}s: killed" >&2
                step=$(step_in "$steps" "${NAMES[k]}")
                if [ -n "$step" ]; then scancel "$step" 2>/dev/null || true; fi
                kill -KILL "${PIDS[k]}" 2>/dev/null || true
            fi
            wait "${PIDS[k]}" 2>/dev/null || true
        done
    done
}

trap 'echo "signal received: stopping the services"; stop_all; exit 143' TERM INT
'''
