#!/usr/bin/env bash
# A local multi-node Ray cluster on this one machine, made with `ray start`: a head plus N worker
# nodes, each a raylet with its own resources, object store and temp dir, every port on 127.0.0.1.
#
#   bash cluster/local_cluster.sh start [--workers N] [--cpus-per-node C] [--head-cpus H]
#                                       [--gpus-per-node G] [--object-store-mb M]
#                                       [--port P] [--dashboard-port D] [--no-dashboard]
#   bash cluster/local_cluster.sh status      (addresses and `ray status`)
#   bash cluster/local_cluster.sh ps          (this cluster's processes)
#   bash cluster/local_cluster.sh stop
#
# Defaults: 2 worker nodes, 1 CPU per node (the head too), no GPUs (with --gpus-per-node G every
# node declares G GPUs, and they are all the machine's GPUs 0..G-1), GCS port 6379, dashboard (and
# job server) on 8265. `start` prints the addresses: `--address 127.0.0.1:PORT` for a raysim driver on
# this machine, http://127.0.0.1:DASHBOARD for `ray job submit`.
#
# State lives in ${RAYSIM_CLUSTER_DIR:-/tmp/raysim-local-cluster}: cluster.env (the addresses),
# n0 (the head's Ray temp dir), n1..nN (the worker nodes'), start logs. Keep that path short (Ray's
# Unix sockets live under it and a socket path has at most 107 bytes). Several clusters can run
# side by side with different RAYSIM_CLUSTER_DIRs and ports. `stop` ends only the processes of this
# cluster (those whose command line names its temp dirs, and their descendants); it never runs
# `ray stop`, which would end every Ray on the machine.
#
# RAY (default: .venv/bin/ray, else `ray` on PATH) picks the Ray installation; its Python runs the
# jobs submitted to the cluster, so use the one raysim is installed in.
#
# Loopback: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray's node address at 127.0.0.1, and Ray binds
# its gRPC ports to loopback only when the node address is exactly 127.0.0.1. But `ray start` refuses
# to start a *worker* node under that setting ("Multi-node Ray clusters are not supported on Windows
# and OSX"), and without it `ray start` rewrites 127.0.0.1 and localhost (in --address and
# --node-ip-address) to the machine's network address. So the worker nodes are started through a
# small shim that lifts only the CLI's refusal (the Ray runtime itself runs several nodes on
# 127.0.0.1, as ray.cluster_utils does in Ray's own tests); everything else is plain `ray start`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${RAYSIM_CLUSTER_DIR:-/tmp/raysim-local-cluster}
if [ -n "${RAY:-}" ]; then :
elif [ -x "$ROOT/.venv/bin/ray" ]; then RAY=$ROOT/.venv/bin/ray
else RAY=$(command -v ray || true); fi
[ -n "$RAY" ] && [ -x "$RAY" ] || { echo "local_cluster: no ray executable (set RAY=... or run scripts/setup.sh)" >&2; exit 2; }
PY=$(dirname "$RAY")/python
[ -x "$PY" ] || PY=python3

# Loopback only, no usage reporting, token authentication (Ray's default where ~/.ray/auth_token
# exists; said explicitly so every client of this cluster agrees), and Ray's workers at normal
# priority (raysim's workers are the computation; see local_ray_environment in
# raysim/engine/executors/session.py). For runs joined one after another with --address, start it
# with RAY_preload_python_modules=torch in the environment (cluster/README.md, "Runs one after
# another"); the nodes inherit it.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token} RAY_worker_niceness=${RAY_worker_niceness:-0}
unset RAY_ADDRESS
# The nodes' processes inherit this PATH: a job's entrypoint `python ...` (ray job submit) must find
# the Python of RAY's installation, where raysim, torch and ray are installed, not the system's.
PATH=$(dirname "$RAY"):$PATH
export PATH

log() { printf '[local_cluster] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

# Our processes: command line names one of this cluster's node temp dirs ($STATE/nK/) or its GCS
# address (the Ray client server), plus all
# their descendants (agents and workers rename themselves to ray::..., but they are the raylet's
# children). Stops like `ray stop` does, in three waves: raylets, then everything else, then the GCS;
# SIGTERM, then SIGKILL after a grace period.
procs_py='
import os, re, sys, time
import psutil

state, action = sys.argv[1], sys.argv[2]
mine = re.compile(re.escape(os.path.realpath(state)) + r"/n[0-9]+(/|\s|$)")
try:  # the Ray client server of the head (started by ray start, then orphaned) names the GCS only
    gcs_port = open(os.path.join(state, "gcs_port")).read().strip()
    mine = re.compile(mine.pattern + r"|--address=127\.0\.0\.1:" + gcs_port + r"(\s|$)")
except OSError:
    pass
roots = []
for p in psutil.process_iter(["pid", "cmdline", "status"]):
    try:
        if p.info["status"] != psutil.STATUS_ZOMBIE and mine.search(" ".join(p.info["cmdline"] or [])):
            roots.append(p)
    except psutil.Error:
        pass
found = {p.pid: p for p in roots}
for p in roots:
    try:
        for c in p.children(recursive=True):
            found.setdefault(c.pid, c)
    except psutil.Error:
        pass
found.pop(os.getpid(), None)
if action == "list":
    for p in found.values():
        try:
            print(p.pid, " ".join(p.cmdline())[:150])
        except psutil.Error:
            pass
    sys.exit(0)

def name(p):
    try:
        return " ".join(p.cmdline()[:1]) + " " + p.name()
    except psutil.Error:
        return ""

waves = [[p for p in found.values() if "raylet/raylet" in name(p)],
         [p for p in found.values() if "raylet/raylet" not in name(p) and "gcs_server" not in name(p)],
         [p for p in found.values() if "gcs_server" in name(p)]]
grace = float(sys.argv[3]) if len(sys.argv) > 3 else 10
killed = 0
for wave in waves:
    for p in wave:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(wave, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=3)
    killed += len(alive)
print(f"stopped {len(found)} processes ({killed} with SIGKILL)")
'

# `ray start` for a worker node with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (see the header): the CLI
# reads ray_constants.ENABLE_RAY_CLUSTER through its own module global; give it a copy of the
# constants that says yes, leaving the rest of Ray (which must keep 127.0.0.1) untouched.
worker_start_py='
import sys, types
import ray._private.ray_constants as constants
from ray.scripts import scripts

view = types.ModuleType(constants.__name__)
view.__dict__.update(constants.__dict__)
view.ENABLE_RAY_CLUSTER = True
scripts.ray_constants = view
sys.argv = ["ray", "start", *sys.argv[1:]]
sys.exit(scripts.main())
'

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_free() { "$PY" -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null; }
running() { [ -n "$("$PY" -c "$procs_py" "$STATE" list)" ]; }

# Number of alive nodes according to `ray status` (one "1 node_<id>" line each under "Active:").
alive_nodes() {
  "$RAY" status --address "127.0.0.1:$1" 2>/dev/null |
    awk '/^Active:/{a=1;next} /^Pending:/{a=0} a && /node_/{n++} END{print n+0}'
}

cmd_start() {
  local workers=2 cpus=1 head_cpus="" gpus=0 store_mb="" port=6379 dash=8265 dashboard=true
  while [ $# -gt 0 ]; do
    case "$1" in
      --workers) workers=$2; shift 2 ;;
      --cpus-per-node) cpus=$2; shift 2 ;;
      --head-cpus) head_cpus=$2; shift 2 ;;
      --gpus-per-node) gpus=$2; shift 2 ;;
      --object-store-mb) store_mb=$2; shift 2 ;;
      --port) port=$2; shift 2 ;;
      --dashboard-port) dash=$2; shift 2 ;;
      --no-dashboard) dashboard=false; shift ;;  # no dashboard, so no job server (`ray job submit`)
      -h|--help) usage; exit 0 ;;
      *) die "unknown option $1 (see --help)" ;;
    esac
  done
  head_cpus=${head_cpus:-$cpus}
  [ "${#STATE}" -le 48 ] || die "RAYSIM_CLUSTER_DIR=$STATE is too long (Ray's socket paths live under it); use a path of at most 48 characters"
  if running; then die "a cluster from $STATE is already running (bash $0 status | stop)"; fi
  port_free "$port" || die "port $port is in use (another Ray?); choose one with --port"
  [ "$dashboard" = false ] || port_free "$dash" || die "dashboard port $dash is in use; choose one with --dashboard-port"
  if [ "$RAY_AUTH_MODE" = token ]; then
    # a token for this cluster and its clients: ~/.ray/auth_token, made if missing (as a local
    # ray.init() does); `ray start --head` with token mode and no token fails
    "$RAY" get-auth-token --generate >/dev/null 2>&1 || die "could not find or make a Ray auth token"
  fi
  if [ -d "$STATE" ] && [ -n "$(ls -A "$STATE")" ] && [ ! -d "$STATE/n0" ]; then
    die "$STATE is not empty and not a local cluster's state; name a new or empty RAYSIM_CLUSTER_DIR"
  fi
  rm -rf "$STATE"
  mkdir -p "$STATE"
  STATE=$(cd "$STATE" && pwd)
  echo "$port" >"$STATE/gcs_port"  # for `stop`: the Ray client server names only the GCS address

  local common=(--dashboard-agent-listen-port 0 --min-worker-port 0 --max-worker-port 0 --disable-usage-stats)
  [ -n "$store_mb" ] && common+=(--object-store-memory $((store_mb * 1024 * 1024)))
  # explicit, also 0: left out, Ray gives every node all of the machine's GPUs
  common+=(--num-gpus "$gpus")

  # the autoscaler's and dashboard's Prometheus ports are fixed (44217, 44227) unless set
  export AUTOSCALER_METRIC_PORT=${AUTOSCALER_METRIC_PORT:-$(free_port)}
  export DASHBOARD_METRIC_PORT=${DASHBOARD_METRIC_PORT:-$(free_port)}
  log "head: GCS 127.0.0.1:$port, dashboard http://127.0.0.1:$dash, $head_cpus CPUs"
  if ! "$RAY" start --head --node-ip-address 127.0.0.1 --port "$port" --num-cpus "$head_cpus" \
      --temp-dir "$STATE/n0" --include-dashboard="$dashboard" --dashboard-host 127.0.0.1 --dashboard-port "$dash" \
      --ray-client-server-port "$(free_port)" "${common[@]}" >"$STATE/start-n0.log" 2>&1; then
    tail -20 "$STATE/start-n0.log" >&2
    cmd_stop >/dev/null 2>&1 || true
    die "the head did not start (log: $STATE/start-n0.log)"
  fi
  local i
  for i in $(seq 1 "$workers"); do
    log "worker node $i: $cpus CPUs"
    if ! "$PY" -c "$worker_start_py" --address "127.0.0.1:$port" --node-ip-address 127.0.0.1 \
        --num-cpus "$cpus" --temp-dir "$STATE/n$i" "${common[@]}" >"$STATE/start-n$i.log" 2>&1; then
      tail -20 "$STATE/start-n$i.log" >&2
      cmd_stop >/dev/null 2>&1 || true
      die "worker node $i did not start (log: $STATE/start-n$i.log)"
    fi
  done
  local want=$((workers + 1)) n=0 t
  for t in $(seq 1 60); do
    n=$(alive_nodes "$port")
    [ "$n" -ge "$want" ] && break
    sleep 1
  done
  if [ "$n" -lt "$want" ]; then
    cmd_stop >/dev/null 2>&1 || true
    die "only $n of $want nodes joined"
  fi
  local dash_url="http://127.0.0.1:$dash"
  [ "$dashboard" = true ] || dash_url="none"
  cat >"$STATE/cluster.env" <<EOF
# source this file to talk to the local cluster
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=$RAY_AUTH_MODE
RAYSIM_CLUSTER_ADDRESS=127.0.0.1:$port
RAYSIM_CLUSTER_DASHBOARD=$dash_url
RAYSIM_CLUSTER_NODES=$want
EOF
  cat <<EOF
local Ray cluster up: head + $workers worker nodes ($n nodes alive), all on 127.0.0.1; state in $STATE
  environment:    export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=$RAY_AUTH_MODE   (or: source $STATE/cluster.env)
  raysim driver:  .venv/bin/python scripts/run.py ... --address 127.0.0.1:$port
  job submission: ray job submit --address $dash_url --working-dir . -- python scripts/run.py ...
  status:         ray status --address 127.0.0.1:$port   (dashboard: $dash_url)
  stop:           bash cluster/local_cluster.sh stop
address 127.0.0.1:$port
dashboard $dash_url
EOF
}

cmd_status() {
  [ -f "$STATE/cluster.env" ] || { echo "no local cluster in $STATE"; running && echo "(but processes of one are running: bash $0 stop)"; return 1; }
  # shellcheck disable=SC1091
  . "$STATE/cluster.env"
  echo "address $RAYSIM_CLUSTER_ADDRESS"
  echo "dashboard $RAYSIM_CLUSTER_DASHBOARD"
  "$RAY" status --address "$RAYSIM_CLUSTER_ADDRESS"
}

cmd_stop() {
  if ! running; then
    echo "no processes of a local cluster in $STATE"
  else
    "$PY" -c "$procs_py" "$STATE" stop "${RAYSIM_CLUSTER_GRACE_S:-10}"
  fi
  rm -f "$STATE/cluster.env"
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  ps) "$PY" -c "$procs_py" "$STATE" list ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
