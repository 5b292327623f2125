#!/usr/bin/env bash
# A real two-node Slurm cluster on one machine, for tests and trials: munge, slurmctld and two slurmd daemons
# (nodes n1 and n2, both on loopback, each with its own port), run without systemd, as root.
#
#   tools/slurm_cluster.sh up      install Debian's packages when missing, start the daemons not running, wait until
#                                  both nodes are up; prints the line to source for the clients (SLURM_CONF=...)
#   tools/slurm_cluster.sh down    cancel every job, stop every daemon this script started (by its pid)
#   tools/slurm_cluster.sh env     the client environment (eval "$(tools/slurm_cluster.sh env)")
#   tools/slurm_cluster.sh status  the nodes and the queue
#   tools/slurm_cluster.sh fail N  lose node N as a machine would: its slurmd, its job steps' slurmstepd and every
#                                  process of theirs killed at once (SIGKILL); `up` brings it back
#
# Settings (environment): FORGE_SLURM_DIR (state, configs and logs; default /tmp/forge-slurm), FORGE_SLURM_PORT
# (slurmctld's port; the nodes take the next two; default 16817), FORGE_SLURM_CPUS (CPUs each node declares;
# default: this machine's), FORGE_SLURM_WAIT_S (how long `up` waits for the nodes; default 120).
set -euo pipefail

DIR=${FORGE_SLURM_DIR:-/tmp/forge-slurm}
PORT=${FORGE_SLURM_PORT:-16817}
CPUS=${FORGE_SLURM_CPUS:-$(nproc)}
WAIT_S=${FORGE_SLURM_WAIT_S:-120}
MEMORY_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
NODES=(n1 n2)
CONF=$DIR/slurm.conf
PACKAGES=(munge slurmctld slurmd slurm-client)

log() { echo "slurm_cluster: $*" >&2; }
die() { log "$*"; exit 1; }

install_packages() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; install them (apt-get install ${PACKAGES[*]}) or run as root"
    log "installing ${missing[*]} with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 "${missing[@]}" >"$DIR/apt.log" 2>&1 \
        || { apt-get update -q >>"$DIR/apt.log" 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$DIR/apt.log" 2>&1; } \
        || die "apt-get install ${missing[*]} failed: see $DIR/apt.log"
}

write_config() {
    local node_port=$((PORT + 1)) node
    cat >"$CONF" <<EOF
# Written by tools/slurm_cluster.sh: a two-node cluster on loopback, state under $DIR.
ClusterName=forge
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=30
MinJobAge=300
EOF
    for node in "${NODES[@]}"; do
        echo "NodeName=$node NodeHostname=localhost NodeAddr=127.0.0.1 Port=$node_port CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN" >>"$CONF"
        node_port=$((node_port + 1))
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >>"$CONF"
}

# running PIDFILE: whether the process named in PIDFILE is alive.
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_daemons() {
    local node
    if ! running "$DIR/munged.pid"; then
        [ -s "$DIR/munge.key" ] || { head -c 1024 /dev/urandom >"$DIR/munge.key"; chmod 0400 "$DIR/munge.key"; }
        munged --force --socket="$DIR/munge.socket" --key-file="$DIR/munge.key" --pid-file="$DIR/munged.pid" \
            --log-file="$DIR/munged.log" --seed-file="$DIR/munged.seed" \
            || die "munged did not start: see $DIR/munged.log"
    fi
    if ! running "$DIR/slurmctld.pid"; then
        slurmctld -f "$CONF" -i || die "slurmctld did not start: see $DIR/slurmctld.log"
    fi
    for node in "${NODES[@]}"; do
        mkdir -p "$DIR/$node"
        if ! running "$DIR/slurmd-$node.pid"; then
            slurmd -f "$CONF" -N "$node" || die "slurmd $node did not start: see $DIR/slurmd-$node.log"
        fi
    done
}

wait_up() {
    local waited=0 states
    export SLURM_CONF=$CONF
    while :; do
        states=$(sinfo -h -N -o "%N %t" 2>/dev/null | sort -u || true)
        # up: idle, or running a job (a requeued one may start as soon as its node is back); not "down" nor "*"
        if [ "$(grep -cE ' (idle|alloc|mix|comp)$' <<<"$states")" -eq ${#NODES[@]} ]; then
            log "nodes up: $(tr '\n' ' ' <<<"$states")"
            return
        fi
        if [ "$waited" -ge "$WAIT_S" ]; then
            log "nodes not up after ${WAIT_S}s: ${states:-no answer from slurmctld}"
            tail -n 5 "$DIR"/slurmctld.log "$DIR"/slurmd-*.log >&2 || true
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

# stop PIDFILE: TERM the process named in PIDFILE and wait for it to exit (KILL after 30 s).
stop() {
    local pid waited=0
    running "$1" || { rm -f "$1"; return 0; }
    pid=$(cat "$1")
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge 30 ]; then kill -KILL "$pid" 2>/dev/null || true; fi
        sleep 0.2
        waited=$((waited + 1))
    done
    rm -f "$1"
}

down() {
    local node
    [ -d "$DIR" ] || return 0
    if running "$DIR/slurmctld.pid"; then
        SLURM_CONF=$CONF scancel --full --quiet --user=root 2>/dev/null || true
    fi
    for node in "${NODES[@]}"; do stop "$DIR/slurmd-$node.pid"; done
    stop "$DIR/slurmctld.pid"
    stop "$DIR/munged.pid"
    log "stopped"
}

# fail NODE: kill NODE's slurmd, the slurmstepd of every job step on it and every process those steps run.
fail_node() {
    local node=$1 step pid found=()
    [[ " ${NODES[*]} " == *" $node "* ]] || die "no node $node (nodes: ${NODES[*]})"
    export SLURM_CONF=$CONF
    for step in $(squeue -h -s -o '%i %N' 2>/dev/null | awk -v n="$node" '$2 == n {print $1}'); do
        found+=($(pgrep -f "^slurmstepd: \[$step\]" || true))
    done
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
        if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qx "SLURMD_NODENAME=$node"; then found+=("$pid"); fi
    done
    running "$DIR/slurmd-$node.pid" && found+=("$(cat "$DIR/slurmd-$node.pid")")
    [ ${#found[@]} -eq 0 ] || kill -KILL "${found[@]}" 2>/dev/null || true
    rm -f "$DIR/slurmd-$node.pid"
    log "node $node lost: killed ${#found[@]} process(es)"
}

case ${1:-} in
    up)
        [ "$(id -u)" -eq 0 ] || die "the daemons run as root here (SlurmUser=root); run as root"
        mkdir -p "$DIR/ctld"
        install_packages
        write_config
        start_daemons
        wait_up
        echo "export SLURM_CONF=$CONF"
        ;;
    down) down ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    status) SLURM_CONF=$CONF sinfo -N; SLURM_CONF=$CONF squeue ;;
    fail) [ -n "${2:-}" ] || die "usage: $0 fail NODE"; fail_node "$2" ;;
    *) die "usage: $0 up|down|env|status|fail NODE" ;;
esac
