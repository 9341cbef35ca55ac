#!/usr/bin/env bash
# The Carina quick start: one node on a 2 GiB loop-device pool plus a host
# directory, dev certificates, and carinactl driving it over mutual TLS.
#
# Usage: hack/demo.sh         run the demo (needs root: loop devices, lvm)
#        hack/demo.sh clean   remove whatever a run left behind (also one
#                             that was killed); safe to repeat
#
# Expects release binaries (`make demo` builds them) in
# ${CARGO_TARGET_DIR:-target}/release, or in CARINA_BIN_DIR.
# Everything lives in .demo/ at the repository root; .demo/state records
# the node's pid and the pool device so `clean` can find them later.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

WORK=.demo                 # relative to $ROOT, which is the working directory
STATE=$WORK/state
IMG=$WORK/pool.img
NODE=demo-node
LVM_GROUP=demo-lvm
HOST_GROUP=demo-host

target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$ROOT/$target ;; esac
BIN=${CARINA_BIN_DIR:-$target/release}

if [ -t 1 ]; then bold=$'\e[1m' dim=$'\e[2m' off=$'\e[0m'; else bold='' dim='' off=''; fi

step() { printf '\n%s==> %s%s\n' "$bold" "$*" "$off"; }
note() { printf '%s%s%s\n' "$dim" "$*" "$off"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

# carinactl, echoed as typed (without the path to the binary).
ctl() {
  printf '$ carinactl %s\n' "$*"
  "$BIN/carinactl" "$@"
}

# expect_error CODE [VAR=value...] -- ARGS...: run carinactl, which must fail
# with CODE; show its message and carry on.
expect_error() {
  local want=$1 env=() rc=0 err
  shift
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  printf '$ %scarinactl %s\n' "${env[*]:+${env[*]} }" "$*"
  err=$(env "${env[@]}" "$BIN/carinactl" "$@" 2>&1 >/dev/null) || rc=$?
  printf '%s\n' "$err"
  [ "$rc" -ne 0 ] || die "expected $want, but the call succeeded"
  case $err in
    *"error: $want:"*) note "(exit status $rc: refused as expected; the demo goes on)" ;;
    *) die "expected $want, got: $err" ;;
  esac
}

state_get() { # state_get KEY: the value recorded in $STATE, or nothing
  [ -f "$STATE" ] || return 0
  sed -n "s/^$1=//p" "$STATE" | tail -n 1
}

state_set() { printf '%s=%s\n' "$1" "$2" >>"$STATE"; }

dm_present() { grep -qs ' device-mapper$' /proc/misc || [ -e /sys/module/dm_mod/initstate ]; }

# LVM --config that sees only the given devices (never the host's own VGs).
lvm_only() {
  local accept=() d
  for d in "$@"; do accept+=("\"a|^$d\$|\""); done
  local IFS=,
  printf 'devices{obtain_device_list_from_udev=0 filter=[%s,"r|.*|"]} activation{udev_sync=0 udev_rules=0}' "${accept[*]}"
}

# Loop devices whose backing file is $1 (volumes exposed in loop mode).
stacked_on() {
  losetup -n -O NAME,BACK-FILE -l 2>/dev/null | awk -v dev="$1" '$2 == dev { print $1 }'
}

is_demo_node() { # is_demo_node PID: it is alive and it is our carina-node
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null &&
    tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -q -- "carina-node --config $WORK/config.json"
}

stop_node() {
  local pid=$1 i
  is_demo_node "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.3
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    note "carina-node (pid $pid) did not stop on SIGTERM within 30 s; killed"
  else
    note "stopped carina-node (pid $pid)"
  fi
  wait "$pid" 2>/dev/null || true
}

# Everything a run may have left: the node, volumes exposed as loop
# devices, the volume group, the pool device, the work directory.
cleanup() {
  local pid pools=() pool dev did=0
  pid=$(state_get WATCH_PID)
  if [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q 'carinactl watch'; then
    kill -TERM "$pid" 2>/dev/null || true
  fi
  pid=$(state_get NODE_PID)
  if is_demo_node "$pid"; then stop_node "$pid"; did=1; fi
  pool=$(state_get POOL)
  [ -z "$pool" ] || pools+=("$pool")
  if [ -e "$IMG" ]; then
    while read -r dev; do
      [ -z "$dev" ] || [[ " ${pools[*]} " == *" $dev "* ]] || pools+=("$dev")
    done < <(losetup -n -O NAME -j "$IMG" 2>/dev/null || true)
  fi
  for pool in "${pools[@]}"; do
    # Only a loop device still backed by our image is ours to touch.
    if ! [ -b "$pool" ] || ! losetup -n -O BACK-FILE "$pool" 2>/dev/null | grep -q "$ROOT/$IMG"; then
      continue
    fi
    for dev in $(stacked_on "$pool"); do
      losetup -d "$dev" 2>/dev/null && note "detached $dev (a volume on $pool)"
    done
    local vgremove=(vgremove -ff -y)
    dm_present || vgremove+=(--driverloaded n)
    if lvm "${vgremove[@]}" --config "$(lvm_only "$pool")" "$LVM_GROUP" >/dev/null 2>&1; then
      note "removed volume group $LVM_GROUP"
    fi
    lvm pvremove -ff -y --config "$(lvm_only "$pool")" "$pool" >/dev/null 2>&1 || true
    losetup -d "$pool" && note "detached the pool device $pool"
    did=1
  done
  if [ -d "$WORK" ]; then
    rm -rf -- "$WORK" && note "removed $WORK/"
    did=1
  fi
  [ "$did" = 1 ] || note "nothing to clean"
}

if [ "${1:-}" = clean ]; then
  [ "$(id -u)" = 0 ] || die "clean needs root (loop devices, lvm)"
  step "Cleaning up the demo"
  cleanup
  exit 0
elif [ $# -gt 0 ]; then
  die "usage: hack/demo.sh [clean]"
fi

[ "$(id -u)" = 0 ] || die "the demo needs root (loop devices, lvm); try: sudo make demo"
for tool in losetup lvm truncate; do
  command -v "$tool" >/dev/null || die "$tool is missing (make deps installs it)"
done
for bin in carina-node carinactl; do
  [ -x "$BIN/$bin" ] || die "$BIN/$bin is missing; build it: cargo build --release -p carina-node -p carina-ctl --bins"
done

on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" -ne 0 ] && [ -s "$WORK/node.log" ]; then
    printf '\ndemo failed (exit status %s); the end of the node log:\n' "$rc" >&2
    tail -n 30 "$WORK/node.log" >&2 || true
  fi
  step "Cleaning up"
  cleanup || true
  exit "$rc"
}

if [ -e "$STATE" ] || [ -d "$WORK" ]; then
  step "Leftovers of an earlier run"
  cleanup
fi
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "Work directory $WORK/"
mkdir -p "$WORK/host"
: >"$STATE"

step "A sparse 2 GiB disk on a loop device"
truncate -s 2G "$IMG"
POOL=$(losetup -f --show -P "$IMG")
state_set POOL "$POOL"
echo "$POOL <- $IMG (sparse: $(du -h "$IMG" | cut -f1) on disk)"

step "A HOST root directory"
echo "$ROOT/$WORK/host"

step "Development certificates (CA, node $NODE, a controller and a reader)"
ctl certs init --dir "$WORK/certs"
ctl certs issue server --node "$NODE" --dns localhost --ip 127.0.0.1 --dir "$WORK/certs"
ctl certs issue client --role controller --dir "$WORK/certs"
ctl certs issue client --role reader --dir "$WORK/certs"

step "Node configuration $WORK/config.json"
cat >"$WORK/config.json" <<EOF
{
  "diskSelector": [
    {
      "name": "$LVM_GROUP",
      "re": ["^${POOL#/dev/}\$"],
      "policy": "LVM",
      "activation": "auto",
      "reserveBytes": $((256 << 20))
    },
    {
      "name": "$HOST_GROUP",
      "policy": "HOST",
      "root": "$ROOT/$WORK/host",
      "reserveBytes": $((256 << 20))
    }
  ],
  "diskScanInterval": 60,
  "schedulerStrategy": "spreadout"
}
EOF
cat "$WORK/config.json"

# A port nobody answers on, starting at $1.
free_port() {
  local p
  for p in $(seq "$1" $(($1 + 500))); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  die "no free port in $1..$(($1 + 500))"
}
PORT=$(free_port 17443)
METRICS_PORT=$(free_port 19180)

step "Starting carina-node on 127.0.0.1:$PORT (log: $WORK/node.log)"
node_args=(
  --config "$WORK/config.json"
  --node-name "$NODE"
  --listen "127.0.0.1:$PORT"
  --metrics-listen "127.0.0.1:$METRICS_PORT"
  --tls-cert "$WORK/certs/node-$NODE.pem"
  --tls-key "$WORK/certs/node-$NODE-key.pem"
  --tls-ca "$WORK/certs/ca.pem"
  --shutdown-grace-secs 5
)
echo "\$ carina-node ${node_args[*]} &"
NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} "$BIN/carina-node" "${node_args[@]}" >"$WORK/node.log" 2>&1 &
NODE_PID=$!
state_set NODE_PID "$NODE_PID"

export CARINA_ENDPOINT="https://127.0.0.1:$PORT"
export CARINA_SERVER_NAME=$NODE
export CARINA_CA=$WORK/certs/ca.pem
export CARINA_CERT=$WORK/certs/controller.pem
export CARINA_KEY=$WORK/certs/controller-key.pem
note "carinactl reads CARINA_ENDPOINT=$CARINA_ENDPOINT, CARINA_SERVER_NAME=$NODE (the name the node's"
note "certificate must carry), CARINA_CA, and the controller's CARINA_CERT/CARINA_KEY"

step "Waiting for the node to answer"
ready=0
for i in $(seq 1 150); do
  kill -0 "$NODE_PID" 2>/dev/null || die "carina-node exited during startup"
  if "$BIN/carinactl" --timeout 2s capacity >/dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.2
done
[ "$ready" = 1 ] || die "carina-node did not answer within 30 s"
echo "ready after $(awk -v n="$i" 'BEGIN { printf "%.1f", n * 0.2 }') s"
grep -m1 -o 'lvm.activation="[^"]*"' "$WORK/node.log" | sed 's/^/node log: /' || true

step "Capacity"
ctl capacity

step "Watching capacity in the background (carinactl watch > $WORK/watch.log)"
"$BIN/carinactl" watch >"$WORK/watch.log" 2>&1 &
WATCH_PID=$!
state_set WATCH_PID "$WATCH_PID"

step "Three volumes: two LVM, one HOST"
ctl lv create web-data --group "$LVM_GROUP" --size 512Mi
ctl lv create db-data --group "$LVM_GROUP" --size 256Mi
ctl lv create scratch --group "$HOST_GROUP" --size 100Mi
note "(repeating a create is a no-op that returns the same volume)"
ctl lv create scratch --group "$HOST_GROUP" --size 100Mi

step "Listing them (two per page; carinactl follows the pages)"
ctl lv list --page-size 2

step "Growing db-data to 768 MiB"
ctl lv resize db-data --size 768Mi

step "The same volume as JSON (exact bytes)"
ctl -o json lv get db-data

step "A request larger than the pool is refused"
expect_error RESOURCE_EXHAUSTED -- lv create too-big --group "$LVM_GROUP" --size 10Gi

step "A reader certificate may read but not create"
printf '$ CARINA_CERT=%s CARINA_KEY=%s carinactl lv list --group %s\n' \
  "$WORK/certs/reader.pem" "$WORK/certs/reader-key.pem" "$HOST_GROUP"
CARINA_CERT=$WORK/certs/reader.pem CARINA_KEY=$WORK/certs/reader-key.pem \
  "$BIN/carinactl" lv list --group "$HOST_GROUP"
expect_error PERMISSION_DENIED CARINA_CERT="$WORK/certs/reader.pem" CARINA_KEY="$WORK/certs/reader-key.pem" \
  -- lv create sneaky --group "$LVM_GROUP" --size 1Gi

step "Deleting the volumes"
ctl lv delete web-data
ctl lv delete db-data
ctl lv delete scratch
ctl lv list

step "Capacity again"
ctl capacity

step "What the watch saw (Ctrl-C ends it; here: SIGINT)"
kill -INT "$WATCH_PID" 2>/dev/null || true
watch_rc=0
wait "$WATCH_PID" || watch_rc=$?
grep '^node ' "$WORK/watch.log" || true
note "(carinactl watch exited with status $watch_rc)"

step "Stopping carina-node (SIGTERM)"
stop_node "$NODE_PID"
# on_exit cleans up the rest.
