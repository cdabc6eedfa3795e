#!/usr/bin/env bash
# local-slurm.sh -- stand up a REAL Slurm cluster on this one host, for paralela's tests and CI
# (defaults here: 2 emulated nodes with 2 fake GPUs each; .ci/run starts and stops it).
#
# Debian 12 (bookworm) / Ubuntu, run as root, no systemd needed: the daemons
# are started directly and tracked by pidfiles.  Uses Debian's Slurm 22.05
# packages + munge, and (by default) slurmdbd + MariaDB so that `sacct`
# works -- submitit needs sacct to see CANCELLED/TIMEOUT/killed jobs.
#
# Usage:
#   local-slurm.sh start            install if needed, write config, start
#                                   munged [+ mariadbd + slurmdbd] + slurmctld
#                                   + slurmd(s), wait until every node is idle.
#                                   Idempotent: on a healthy cluster it only
#                                   re-checks; if the generated config changed
#                                   the slurm daemons are restarted.
#   local-slurm.sh stop [--purge]   cancel all jobs, then stop ONLY the daemons
#                                   this script started (by pidfile, checking
#                                   the process name first).  --purge also
#                                   deletes state, logs, the accounting DB and
#                                   the config files this script wrote.
#   local-slurm.sh restart          stop + start
#   local-slurm.sh status           daemons, sinfo, squeue
#   local-slurm.sh install          only apt-get install the packages
#   local-slurm.sh selftest         smoke test: srun, sbatch, array, env vars,
#                                   scancel, requeue, sacct (exit 0 = all good)
#
# Knobs (environment variables; use the same values for every subcommand):
#   LOCAL_SLURM_DIR        /tmp/local-slurm   state, spool, logs, pidfiles, DB
#   LOCAL_SLURM_NODES      1                  emulated nodes. 1 => one node
#                                             named `hostname -s`; N>1 =>
#                                             node1..nodeN, one slurmd each on
#                                             its own port, all on 127.0.0.1
#                                             (a "127.0.0.1 node1 ..." line is
#                                             added to /etc/hosts so the names
#                                             resolve; purge removes it).
#   LOCAL_SLURM_CPUS       $(nproc)           CPUs per node (may exceed the
#                                             real count: config_overrides)
#   LOCAL_SLURM_MEM_MB     90% of RAM/nodes   RealMemory per node
#   LOCAL_SLURM_PARTITION  debug              the (default) partition
#   LOCAL_SLURM_GPUS       0                  fake GPUs per node (GRES gpu).
#                                             Backed by char devices made
#                                             with mknod (clones of /dev/null)
#                                             so Slurm sets
#                                             CUDA_VISIBLE_DEVICES etc.
#   LOCAL_SLURM_ACCOUNTING 1                  1 => slurmdbd + MariaDB, sacct
#                                             works (+~190 MB of packages);
#                                             0 => no sacct (it errors with
#                                             "accounting storage is disabled")
#   LOCAL_SLURM_CONF       /etc/slurm/slurm.conf  where slurm.conf is written
#                                             (slurmdbd.conf, gres.conf go
#                                             beside it);
#                                             anything else => clients need
#                                             export SLURM_CONF=<path>.
#   LOCAL_SLURM_CTLD_PORT  6817               slurmctld port; slurmd ports are
#                                             +1..+N, slurmdbd port is +100
#   LOCAL_SLURM_FORCE      0                  1 => overwrite config files that
#                                             this script did not write
#   LOCAL_SLURM_TIMEOUT    60                 seconds to wait for readiness
#   LOCAL_SLURM_NODE_PREFIX node              N>1 => nodes are PREFIX1..PREFIXN
#                                             (a second cluster beside the
#                                             first needs its own prefix: its
#                                             /etc/hosts line is tagged with it)
# shellcheck disable=SC2016  # single-quoted $VARS are meant for the job shell
set -euo pipefail

D=${LOCAL_SLURM_DIR:-/tmp/local-slurm}
NODES=${LOCAL_SLURM_NODES:-2}  # paralela: 2 emulated nodes for multi-node tests
CPUS=${LOCAL_SLURM_CPUS:-$(nproc)}
PART=${LOCAL_SLURM_PARTITION:-debug}
ACCT=${LOCAL_SLURM_ACCOUNTING:-1}
GPUS=${LOCAL_SLURM_GPUS:-2}  # paralela: 2 fake GPUs per node for packing tests
CONF=${LOCAL_SLURM_CONF:-/etc/slurm/slurm.conf}
CTLD_PORT=${LOCAL_SLURM_CTLD_PORT:-6817}
DBD_PORT=$((CTLD_PORT + 100))
FORCE=${LOCAL_SLURM_FORCE:-0}
TIMEOUT=${LOCAL_SLURM_TIMEOUT:-60}
PREFIX=${LOCAL_SLURM_NODE_PREFIX:-node}
HOST=$(hostname -s)
CLUSTER=localcluster

DBD_CONF="$(dirname "$CONF")/slurmdbd.conf"   # slurmdbd looks beside slurm.conf
GRES_CONF="$(dirname "$CONF")/gres.conf"       # so does slurmd
MARKER="# Generated by local-slurm.sh -- safe to delete"
MUNGE_PID="$D/run/munge/munged.pid"           # dir owned by munge (see below)
MYSQL_PID="$D/run/mysqld/mariadbd.pid"
# slurmdbd cannot be told a MySQL socket path: libmariadb's default is used.
MYSQL_SOCK=/run/mysqld/mysqld.sock
export SLURM_CONF="$CONF"   # our own client/daemon calls must read our config

if [ -z "${LOCAL_SLURM_MEM_MB:-}" ]; then
  mem_total_kb=$(awk '/^MemTotal:/{print $2}' /proc/meminfo)
  LOCAL_SLURM_MEM_MB=$(( mem_total_kb * 9 / 10 / 1024 / NODES ))
fi
MEM=$LOCAL_SLURM_MEM_MB

log() { printf '[local-slurm] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s; }

# Node names: a single node is named after the host (what users expect);
# several emulated nodes are node1..nodeN.
node_names() {
  if [ "$NODES" -eq 1 ]; then echo "$HOST"
  else seq -f "${PREFIX}%g" 1 "$NODES"; fi
}

# ---------------------------------------------------------------- install --
do_install() {
  local pkgs=(slurmctld slurmd slurm-client munge) need=0 c
  for c in slurmctld slurmd sbatch munged; do command -v "$c" >/dev/null || need=1; done
  if [ "$ACCT" = 1 ]; then
    pkgs+=(slurmdbd mariadb-server)
    for c in slurmdbd mariadbd mariadb-install-db; do command -v "$c" >/dev/null || need=1; done
  fi
  [ "$need" = 1 ] || return 0
  [ "$(id -u)" -eq 0 ] || die "must run as root to apt-get install"
  # --no-install-recommends: slurm+munge are 8 packages (~3.5 MB download,
  # ~13 MB on disk) instead of 43 for the slurm-wlm metapackage (hdf5, rrd,
  # ipmi, rocm...).  slurmdbd+mariadb-server add ~24 packages, ~190 MB.
  # The postinst scripts try to start the services; in containers
  # policy-rc.d denies that (harmless "invoke-rc.d" messages).  The munge
  # postinst creates /etc/munge/munge.key.
  export DEBIAN_FRONTEND=noninteractive
  log "apt-get install ${pkgs[*]}"
  if ! apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null; then
    log "install failed; running apt-get update and retrying"
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null
  fi
}

# ------------------------------------------------------------ pid helpers --
# alive PIDFILE COMM -> true if the pidfile names a live process called COMM
# (guards against stale pidfiles and PID reuse).
alive() {
  local pf=$1 comm=$2 pid
  [ -s "$pf" ] || return 1
  pid=$(cat "$pf")
  [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$comm" ]
}

# stop_pids COMM:PIDFILE... -> SIGTERM all of them at once (each daemon takes
# ~2 s to exit), wait up to 30 s, then SIGKILL stragglers.  Only ever
# signals PIDs recorded in our own pidfiles, after checking the name.
stop_pids() {
  local spec pf comm pid pids=() i left
  for spec in "$@"; do
    comm=${spec%%:*}; pf=${spec#*:}
    if alive "$pf" "$comm"; then
      pid=$(cat "$pf"); pids+=("$pid")
      log "stopping $comm (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
    fi
    rm -f "$pf"
  done
  [ "${#pids[@]}" -gt 0 ] || return 0
  for i in $(seq 1 300); do
    left=0
    for pid in "${pids[@]}"; do [ -d "/proc/$pid" ] && left=1; done
    [ "$left" = 0 ] && return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    if [ -d "/proc/$pid" ]; then
      log "pid $pid ignored SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

# wait_for DESCRIPTION LOGFILE CMD... -> poll CMD every 0.1 s until it works.
wait_for() {
  local what=$1 logf=$2 deadline=$(( $(now) + TIMEOUT )); shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(now)" -ge "$deadline" ]; then
      [ -e "$logf" ] && tail -20 "$logf" >&2
      die "$what not ready after ${TIMEOUT}s (log: $logf)"
    fi
    sleep 0.1
  done
}

# ------------------------------------------------------------------ munge --
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  if munge_ok; then
    alive "$MUNGE_PID" munged || log "munged already running (not ours; leaving it alone)"
    return 0
  fi
  # Runtime dirs: /run may be a fresh tmpfs; the package made the others.
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge /etc/munge
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
  fi
  # munged refuses insecure ownership/permissions on its key and dirs, and
  # should not run as root: run it as the munge user.  The pidfile goes in
  # our own run dir so "stop" can tell our munged from a system one; that dir
  # must be writable by munge (munged silently skips an unwritable pidfile).
  install -d -o munge -g munge -m 0755 "$D/run/munge"
  runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PID"
  wait_for munged /var/log/munge/munged.log munge_ok
}

# ---------------------------------------------------- MariaDB + slurmdbd --
mysql_ok() { mariadb --no-defaults --socket="$MYSQL_SOCK" -u root -e 'select 1'; }

start_mariadb() {
  alive "$MYSQL_PID" mariadbd && return 0
  if mysql_ok >/dev/null 2>&1; then
    log "a MariaDB/MySQL server already answers on $MYSQL_SOCK (not ours); slurmdbd will use it"
    return 0
  fi
  install -d -o mysql -g mysql -m 0750 "$D/mysql"
  install -d -o mysql -g mysql -m 0755 "$D/run/mysqld" /run/mysqld
  if [ ! -d "$D/mysql/mysql" ]; then
    log "initialising MariaDB datadir $D/mysql"
    mariadb-install-db --no-defaults --user=mysql --datadir="$D/mysql" \
      --skip-test-db >"$D/log/mariadb-install-db.log" 2>&1 \
      || { tail -20 "$D/log/mariadb-install-db.log" >&2; die "mariadb-install-db failed"; }
  fi
  # Private instance: own datadir, no TCP (unix socket only), small buffers.
  # root@localhost authenticates by unix_socket, so slurmdbd (running as
  # root) needs no password.  setsid: not in our caller's process group.
  log "starting mariadbd"
  setsid -f runuser -u mysql -- mariadbd --no-defaults --datadir="$D/mysql" \
    --socket="$MYSQL_SOCK" --pid-file="$MYSQL_PID" --skip-networking \
    --log-error="$D/log/mariadb.log" --innodb-buffer-pool-size=64M \
    --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1
  wait_for mariadbd "$D/log/mariadb.log" mysql_ok
}

write_dbd_conf() {
  write_file "$DBD_CONF" 0600 <<EOF
$MARKER
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
AuthType=auth/munge
PidFile=$D/run/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
}

start_slurmdbd() {
  if ! alive "$D/run/slurmdbd.pid" slurmdbd; then
    log "starting slurmdbd"
    slurmdbd                    # daemonizes; reads $DBD_CONF (beside SLURM_CONF)
  fi
  # sacctmgr talks to slurmdbd; the first start creates the schema (~1 s).
  wait_for slurmdbd "$D/log/slurmdbd.log" sacctmgr -n -P show cluster
}

# ----------------------------------------------------------- config files --
# write_file PATH MODE < content -> CONF_CHANGED=1 if PATH got new content.
# Refuses to clobber a file this script did not write (unless FORCE=1).
write_file() {
  local path=$1 mode=$2 tmp
  tmp=$(mktemp "$D/.conf.XXXXXX")
  cat >"$tmp"; chmod "$mode" "$tmp"
  if [ -e "$path" ] && ! grep -qxF "$MARKER" "$path"; then
    [ "$FORCE" = 1 ] || { rm -f "$tmp"; die "$path exists and was not written by this script (LOCAL_SLURM_FORCE=1 overwrites it, keeping a .bak)"; }
    cp -p "$path" "$path.bak"
  fi
  if [ -e "$path" ] && cmp -s "$tmp" "$path"; then rm -f "$tmp"; return 0; fi
  mkdir -p "$(dirname "$path")"
  mv "$tmp" "$path"
  CONF_CHANGED=1
  log "wrote $path"
}

gen_slurm_conf() {
  local i=0 n acct gres=""
  if [ "$GPUS" -gt 0 ]; then gres=" Gres=gpu:$GPUS"; fi
  if [ "$ACCT" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# Per-step CPU/memory usage for sacct/sstat (polls /proc).
JobAcctGatherType=jobacct_gather/linux"
  else
    acct="# No slurmdbd: sacct fails; use scontrol show job / squeue / JobCompLoc.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
  fi
  {
    cat <<EOF
$MARKER
ClusterName=$CLUSTER
# Controller on this host; explicit address => no DNS needed.
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire (default 120 s) is also how long a requeued job waits before
# it may start again; keep it short for tests.
AuthInfo=cred_expire=5
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
# No cgroup/systemd assumptions: plain /proc process tracking, no binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
# Cores are consumable, memory is not (so --mem only has to fit RealMemory
# and no DefMemPerCPU is needed).
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# batch_sched_delay defaults to 3 s (=> 3 s gaps between array tasks);
# fast backfill/main loops so requeued/held jobs start promptly.
SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=5
# Trust the CPUs/RealMemory below instead of the detected hardware, so
# several emulated nodes (or more CPUs than cores) are allowed.
SlurmdParameters=config_overrides
ReturnToService=2
# Keep finished jobs visible to "scontrol show job" / squeue -t all for 1 h.
MinJobAge=3600
KillWait=5
InactiveLimit=0
MailProg=/bin/true
$acct
# One line per finished job (JobId, JobState, ExitCode, times...).
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
EOF
    if [ "$GPUS" -gt 0 ]; then echo "GresTypes=gpu"; fi
    for n in $(node_names); do
      i=$((i + 1))
      echo "NodeName=$n NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((CTLD_PORT + i)) CPUs=$CPUS RealMemory=$MEM${gres} State=UNKNOWN"
    done
    echo "PartitionName=$PART Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  }
}

# Fake GPUs: Slurm only exports CUDA_VISIBLE_DEVICES / SLURM_JOB_GPUS for a
# GRES whose File= is a character (or block) device; a regular file is
# rejected ("is not a valid character or block device").  Char devices
# 1:3 behave exactly like /dev/null.  With task/none there is no cgroup
# device confinement, so nothing ever opens them.
gpu_files() { # NODE -> File= expression for gres.conf
  if [ "$GPUS" -eq 1 ]; then echo "$D/dev/$1-gpu0"; else echo "$D/dev/$1-gpu[0-$((GPUS - 1))]"; fi
}
write_gres_conf() {
  local n
  if [ "$GPUS" -gt 0 ]; then
    {
      echo "$MARKER"
      echo "AutoDetect=off"
      for n in $(node_names); do echo "NodeName=$n Name=gpu File=$(gpu_files "$n")"; done
    } > "$D/.gres.conf"
    write_file "$GRES_CONF" 0644 < "$D/.gres.conf"
    rm -f "$D/.gres.conf"
  elif [ -e "$GRES_CONF" ] && grep -qxF "$MARKER" "$GRES_CONF"; then
    rm -f "$GRES_CONF"; CONF_CHANGED=1
  fi
}
make_gpu_devices() {
  local n i
  [ "$GPUS" -gt 0 ] || return 0
  mkdir -p "$D/dev"
  for n in $(node_names); do
    for i in $(seq 0 $((GPUS - 1))); do
      [ -c "$D/dev/$n-gpu$i" ] || mknod -m 0666 "$D/dev/$n-gpu$i" c 1 3
    done
  done
}

# Emulated node names must resolve (e.g. MASTER_ADDR=<first node> for
# torch.distributed).  One tagged line in /etc/hosts, rewritten in place
# (cat >, not sed -i: /etc/hosts is often a bind mount in containers).
HOSTS_TAG="# local-slurm.sh emulated nodes"
[ "$PREFIX" = node ] || HOSTS_TAG="# local-slurm.sh emulated $PREFIX-nodes"  # not a substring of the default tag
hosts_line() {
  local want="" cur
  if [ "$NODES" -gt 1 ]; then want="127.0.0.1 $(node_names | tr '\n' ' ')$HOSTS_TAG"; fi
  cur=$(grep -F "$HOSTS_TAG" /etc/hosts || true)
  [ "$cur" = "$want" ] && return 0
  { grep -vF "$HOSTS_TAG" /etc/hosts || true; [ -z "$want" ] || echo "$want"; } > "$D/.hosts"
  cat "$D/.hosts" > /etc/hosts; rm -f "$D/.hosts"
}

# ---------------------------------------------------------- start / wait --
start_slurm() {
  local n
  if ! alive "$D/run/slurmctld.pid" slurmctld; then
    log "starting slurmctld"
    slurmctld                       # daemonizes, writes SlurmctldPidFile
  fi
  for n in $(node_names); do
    mkdir -p "$D/spool/$n"
    if ! alive "$D/run/slurmd-$n.pid" slurmd; then
      log "starting slurmd for node $n"
      slurmd -N "$n"
    fi
  done
}

wait_ready() {
  local deadline states bad n
  wait_for slurmctld "$D/log/slurmctld.log" sh -c 'scontrol ping | grep -q "is UP"'
  deadline=$(( $(now) + TIMEOUT ))
  while :; do
    # %T = long state; healthy ones: idle, mixed, allocated, completing
    states=$(sinfo -h -N -p "$PART" -o '%N %T' 2>/dev/null || true)
    bad=$(echo "$states" | awk '$2 !~ /^(idle|mixed|allocated|completing)$/ {print $1}')
    [ -n "$states" ] && [ -z "$bad" ] && break
    # A node left DOWN/DRAINED by an earlier unclean stop: resume it.
    for n in $(echo "$states" | awk '$2 ~ /^(down|drained|draining)/ {print $1}'); do
      scontrol update NodeName="$n" State=RESUME 2>/dev/null || true
    done
    if [ "$(now)" -ge "$deadline" ]; then
      echo "$states" >&2; tail -20 "$D"/log/slurmd-*.log >&2
      die "nodes not ready after ${TIMEOUT}s"
    fi
    sleep 0.1
  done
  if [ "$ACCT" = 1 ]; then
    # slurmctld registers the cluster in slurmdbd by itself on startup.
    wait_for "cluster registration" "$D/log/slurmctld.log" \
      sh -c "sacctmgr -n -P show cluster format=cluster | grep -qx $CLUSTER"
  fi
  log "ready: $(sinfo -h -p "$PART" -o '%P %D node(s), CPUs A/I/O/T=%C, %t')"
}

cmd_start() {
  [ "$(id -u)" -eq 0 ] || die "run as root"
  do_install
  mkdir -p "$D/state" "$D/log" "$D/run" "$D/spool"
  start_munge
  CONF_CHANGED=0
  # (process substitution, not a pipe: write_file must run in this shell)
  write_file "$CONF" 0644 < <(gen_slurm_conf)
  if [ "$ACCT" = 1 ]; then write_dbd_conf; fi
  write_gres_conf
  make_gpu_devices
  hosts_line
  if [ "$CONF_CHANGED" = 1 ] && alive "$D/run/slurmctld.pid" slurmctld; then
    log "config changed; restarting slurm daemons"
    stop_slurm
  fi
  if [ "$ACCT" = 1 ]; then start_mariadb; start_slurmdbd; fi
  start_slurm
  wait_ready
  [ "$CONF" = /etc/slurm/slurm.conf ] || log "clients need: export SLURM_CONF=$CONF"
}

# ------------------------------------------------------------------- stop --
stop_slurm() {
  local pf i ids
  if alive "$D/run/slurmctld.pid" slurmctld; then
    # Cancel every job so no slurmstepd/job processes outlive slurmd.
    ids=$(squeue -h -o '%A' 2>/dev/null | sort -u || true)
    if [ -n "$ids" ]; then
      log "cancelling jobs: $(echo "$ids" | tr '\n' ' ')"
      # shellcheck disable=SC2086
      scancel $ids 2>/dev/null || true
      for i in $(seq 1 100); do
        [ -z "$(squeue -h -o '%A' 2>/dev/null || true)" ] && break
        sleep 0.2
      done
    fi
  fi
  # slurmds and slurmctld together; slurmdbd after slurmctld (which flushes
  # its last job records to it on shutdown).
  local specs=("slurmctld:$D/run/slurmctld.pid")
  for pf in "$D"/run/slurmd-*.pid; do
    if [ -e "$pf" ]; then specs+=("slurmd:$pf"); fi
  done
  stop_pids "${specs[@]}"
  stop_pids "slurmdbd:$D/run/slurmdbd.pid"
}

cmd_stop() {
  stop_slurm
  # (pidfiles exist only for daemons WE started: a system munged/MariaDB
  # that was already running is left alone)
  stop_pids "mariadbd:$MYSQL_PID" "munged:$MUNGE_PID"
  if [ "${1:-}" = --purge ]; then
    log "purging $D"
    if grep -qF "$HOSTS_TAG" /etc/hosts; then
      mkdir -p "$D"; NODES=1 hosts_line      # drop our /etc/hosts line
    fi
    rm -rf "$D"
    local f
    for f in "$CONF" "$DBD_CONF" "$GRES_CONF"; do
      if [ -e "$f" ] && grep -qxF "$MARKER" "$f"; then rm -f "$f"; fi
    done
  fi
}

# ----------------------------------------------------------------- status --
cmd_status() {
  local pf rc=0 name comm
  for pf in "$MUNGE_PID" "$MYSQL_PID" "$D/run/slurmdbd.pid" "$D/run/slurmctld.pid" "$D"/run/slurmd-*.pid; do
    [ -e "$pf" ] || continue
    name=$(basename "$pf" .pid); comm=${name%%-*}
    if alive "$pf" "$comm"; then echo "$name: running (pid $(cat "$pf"))"
    else echo "$name: NOT running (stale pidfile)"; rc=1; fi
  done
  if scontrol ping 2>/dev/null | grep -q 'is UP'; then
    sinfo -N; squeue
  else
    echo "slurmctld: not responding"; rc=1
  fi
  return $rc
}

# --------------------------------------------------------------- selftest --
# Waits for a job (or a whole array) to leave the queue.
wait_job() {
  local jid=$1 i
  for i in $(seq 1 $((TIMEOUT * 10))); do
    [ -z "$(squeue -h -j "$jid" 2>/dev/null || true)" ] && return 0
    sleep 0.1
  done
  die "job $jid still queued after ${TIMEOUT}s"
}
job_state() { scontrol show job "$1" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -1; }
wait_running() {
  local i
  for i in $(seq 1 100); do [ "$(job_state "$1")" = RUNNING ] && return 0; sleep 0.1; done
  die "job $1 not RUNNING: $(job_state "$1")"
}

cmd_selftest() {
  local tmp t0 jid out ntasks st cjid
  tmp=$(mktemp -d /tmp/local-slurm-selftest.XXXXXX)
  # shellcheck disable=SC2064  # expand $tmp now
  trap "rm -rf '$tmp'" EXIT
  ntasks=$(( CPUS < 2 ? CPUS : 2 ))
  t0=$(date +%s.%N)

  echo "== srun -N1 -n$ntasks hostname"
  out=$(srun -N1 -n"$ntasks" hostname)
  echo "$out"
  [ "$(echo "$out" | wc -l)" -eq "$ntasks" ] || die "srun: expected $ntasks lines"

  echo "== srun env vars"
  srun -n"$ntasks" bash -c 'echo "SLURM_PROCID=$SLURM_PROCID SLURM_NTASKS=$SLURM_NTASKS SLURM_NODELIST=$SLURM_NODELIST SLURM_JOB_ID=$SLURM_JOB_ID SLURMD_NODENAME=$SLURMD_NODENAME"' | sort

  if [ "$NODES" -gt 1 ]; then
    echo "== srun -N$NODES (one task per emulated node)"
    srun -N"$NODES" --ntasks-per-node=1 -l bash -c 'echo "$SLURMD_NODENAME nodeid=$SLURM_NODEID"' | sort
  fi

  if [ "$GPUS" -gt 0 ]; then
    echo "== fake GPUs: srun --gres=gpu:1 / -n2 --gpus-per-task=1"
    out=$(srun --gres=gpu:1 printenv CUDA_VISIBLE_DEVICES)
    echo "CUDA_VISIBLE_DEVICES=$out"
    [ "$out" = 0 ] || die "expected CUDA_VISIBLE_DEVICES=0, got '$out'"
    if [ "$GPUS" -ge 2 ] && [ "$CPUS" -ge 2 ]; then
      srun -N1 -n2 --gpus-per-task=1 -l printenv CUDA_VISIBLE_DEVICES | sort
    fi
  fi

  echo "== sbatch --wrap"
  jid=$(sbatch --parsable -o "$tmp/batch-%j.out" --wrap 'echo "job=$SLURM_JOB_ID node=$SLURMD_NODENAME cpus=$SLURM_CPUS_ON_NODE"')
  wait_job "$jid"
  cat "$tmp/batch-$jid.out"
  [ "$(job_state "$jid")" = COMPLETED ] || die "sbatch job $jid: $(job_state "$jid")"

  echo "== failing job reports FAILED + exit code"
  jid=$(sbatch --parsable -o /dev/null --wrap 'exit 3')
  wait_job "$jid"
  scontrol show job "$jid" | grep -o 'JobState=[A-Z]* \|ExitCode=[0-9:]*' | tr '\n' ' '; echo
  [ "$(job_state "$jid")" = FAILED ] || die "expected FAILED"

  echo "== sbatch --array=0-5%2"
  jid=$(sbatch --parsable --array=0-5%2 -o "$tmp/arr-%A_%a.out" --wrap 'echo "task=$SLURM_ARRAY_TASK_ID of array=$SLURM_ARRAY_JOB_ID (job $SLURM_JOB_ID)"')
  wait_job "$jid"
  cat "$tmp"/arr-"$jid"_*.out
  [ "$(cat "$tmp"/arr-"$jid"_*.out | wc -l)" -eq 6 ] || die "array: expected 6 outputs"

  echo "== scancel a running job"
  cjid=$(sbatch --parsable -o /dev/null --wrap 'sleep 300')
  wait_running "$cjid"
  scancel "$cjid"; wait_job "$cjid"
  [ "$(job_state "$cjid")" = CANCELLED ] || die "expected CANCELLED, got $(job_state "$cjid")"
  echo "job $cjid CANCELLED"

  echo "== scontrol requeue (job restarts after ~cred_expire)"
  jid=$(sbatch --parsable --open-mode=append -o "$tmp/rq-%j.out" --wrap 'echo "run SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}"; [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || sleep 300')
  wait_running "$jid"
  scontrol requeue "$jid"
  wait_job "$jid"
  grep '^run' "$tmp/rq-$jid.out"
  grep -q 'SLURM_RESTART_COUNT=1' "$tmp/rq-$jid.out" || die "requeue: no second run"

  if [ "$ACCT" = 1 ]; then
    echo "== sacct (records reach slurmdbd asynchronously: poll)"
    for _ in $(seq 1 100); do
      st=$(sacct -n -X -P -o State -j "$cjid" 2>/dev/null | head -1)
      case "$st" in CANCELLED*) break ;; esac
      sleep 0.1
    done
    sacct -X -P -o JobID,State,ExitCode -j "$cjid"
    case "$st" in CANCELLED*) ;; *) die "sacct: expected CANCELLED for $cjid, got '$st'" ;; esac
  fi

  echo "selftest OK in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
}

case "${1:-start}" in
  start)    cmd_start ;;
  stop)     cmd_stop "${2:-}" ;;
  restart)  cmd_stop; cmd_start ;;
  status)   cmd_status ;;
  install)  do_install ;;
  selftest) cmd_selftest ;;
  *) awk 'NR > 1 && /^# shellcheck/ {exit} NR > 1 {print}' "$0"; exit 2 ;;
esac
