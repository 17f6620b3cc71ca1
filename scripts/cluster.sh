#!/usr/bin/env bash
# A cluster on one machine: N network namespaces ("nodes") joined by shaped links to a
# switch, COMMAND run on N*R ranks across them, everything torn down afterwards.
# `bash scripts/cluster.sh --help` explains the options; the body is at the end.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bash scripts/cluster.sh --nodes N --ranks-per-node R --rate RATE
                               [--delay D] [--loss P] [--torch] [--timeout S]
                               [--fault KIND:NODE[:ARG]@SECONDS]... -- COMMAND ARGS...

Brings up N "nodes" on this machine, runs COMMAND as N*R ranks across them, tears
everything down and exits with COMMAND's status. Needs root (network namespaces, tc).

How the cluster is built
  Every node is a network namespace with one interface, eth0 (address 10.77.0.<i+1>/24),
  joined by a veth pair to a bridge in a separate "switch" namespace. Both ends of
  each node's link are shaped with tc: every node sends and receives at RATE. Ranks
  on the same node share the node (Open MPI uses shared memory between them); every
  byte between nodes crosses two shaped links. Nothing is created in this machine's
  own network namespace: all addresses, links and qdiscs live in namespaces this
  script creates (named scpcl-<pid>-*), and removing those namespaces removes them.

Link model
  --rate RATE      each node's link rate, in tc units: 100mbit, 1gbit, 20mbit, 500kbit.
                   Shaped by a token bucket (tbf).
  --delay D        one-way delay added on each link end, e.g. 1ms: a frame from one node
                   to another crosses two link ends, so it arrives 2*D later (a round
                   trip takes 4*D more). With the kernel's netem qdisc: netem on every
                   link end. Without netem (tbf only queues while a link is over its rate,
                   and nftables can drop a packet but not hold it back): the switch is a
                   user-space learning switch instead of the bridge
                   (scripts/cluster_delay_switch.cpp, compiled with g++ on the spot), which
                   holds every frame 2*D before forwarding it; tbf still shapes both ends
                   of every link.
  --loss P         packet loss on each link end, in percent with at most two decimals,
                   e.g. 2 or 0.5: every packet leaving and every packet entering a node
                   is dropped with probability P/100, independently. With netem: its
                   `loss` (with the rate in netem too). Without netem: tbf for the rate
                   and an nftables rule in each node's namespace (table inet scpcl,
                   `numgen random mod 10000 < P*100 drop` on eth0's output and
                   prerouting, with counters), installing nftables from apt when `nft`
                   is missing; the node's eth0 then carries one packet per segment
                   (gso_max_segs 1), so a drop loses one wire packet, as on a real link,
                   not a 64 KiB offloaded burst. The per-node drop counts are printed at
                   the end beside the bytes.

Launch
  default          Open MPI: mpirun runs in node 0's namespace, one orted per other node
                   is started through a plm_rsh_agent script that runs `ip netns exec`
                   (so MPI sees N separate hosts and moves data between them over its
                   TCP transport, eth0 only). Ranks fill node 0 first: ranks
                   i*R .. i*R+R-1 run on node i.
  --torch          no mpirun: COMMAND is started N*R times, each in its node's
                   namespace, with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
                   MASTER_ADDR (node 0), MASTER_PORT and GLOO_SOCKET_IFNAME=eth0 set,
                   for torch.distributed's env:// init over gloo. The exit status is the
                   first failing rank's (by rank), else 0.
  --timeout S      stop everything after S seconds and exit 124 (a backstop for tests:
                   a hung COMMAND cannot hang the caller).

Faults (each may be repeated; SECONDS counted from COMMAND's start)
  link-down:NODE@S        set NODE's link down (its switch port), as a cable pulled.
  kill:NODE@S             SIGKILL every rank process on NODE (the node's ranks die).
  slow:NODE:FACTOR@S      divide NODE's link rate by FACTOR (e.g. slow:1:100@2).
  loss:NODE:PERCENT@S     drop PERCENT of NODE's packets, both directions, from then on
                          (netem, or nftables as --loss; without netem, every node's eth0
                          carries one packet per segment from the start, so the drops are
                          wire packets).
  Every fault prints one line "cluster: fault ... at T s" on stderr when applied.
  TCP in the node namespaces gives up on an unacknowledged segment after about 10 s
  (net.ipv4.tcp_retries2=5), and Open MPI's runtime probes idle daemon connections
  every second (keepalive), so a dead link or node ends the job instead of hanging it.

Examples
  bash scripts/cluster.sh --nodes 2 --ranks-per-node 2 --rate 1gbit -- \
      build/release/sparsecp run --no-calibrate
  bash scripts/cluster.sh --nodes 4 --ranks-per-node 1 --rate 200mbit \
      --fault slow:1:100@3 --timeout 120 -- build/release/sparsecp run
  bash scripts/cluster.sh --nodes 2 --ranks-per-node 2 --rate 1gbit --torch -- \
      .venv/bin/python my_gloo_job.py

Exit status: COMMAND's; 2 for a usage error; 3 when the cluster cannot be built here
(not root, iproute2 missing and not installable, --delay with neither netem nor a
compiler for the user-space switch, loss with neither netem nor a working nftables); 124 on
--timeout. Everything the script made is removed on exit, on failure and on
SIGINT/SIGTERM/SIGHUP; namespaces left by a run killed with SIGKILL are removed by the
next run (their owner's pid is gone).
EOF
}

die() { echo "cluster: $*" >&2; exit "${2:-2}"; }
fail() { echo "cluster: $1" >&2; exit 3; }

nodes= ranks_per_node= rate= delay= loss= torch=0 timeout_s= faults=()
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --nodes) nodes=${2-}; shift 2 || die "--nodes needs a value" ;;
    --ranks-per-node) ranks_per_node=${2-}; shift 2 || die "--ranks-per-node needs a value" ;;
    --rate) rate=${2-}; shift 2 || die "--rate needs a value" ;;
    --delay) delay=${2-}; shift 2 || die "--delay needs a value" ;;
    --loss) loss=${2-}; shift 2 || die "--loss needs a value" ;;
    --timeout) timeout_s=${2-}; shift 2 || die "--timeout needs a value" ;;
    --fault) faults+=("${2-}"); shift 2 || die "--fault needs a value" ;;
    --torch) torch=1; shift ;;
    --) shift; break ;;
    *) die "unknown option '$1' (COMMAND goes after --; see --help)" ;;
  esac
done
(($#)) || die "no COMMAND given after -- (see --help)"
[[ $nodes =~ ^[1-9][0-9]*$ ]] && ((nodes <= 200)) || die "--nodes must be 1..200, got '$nodes'"
[[ $ranks_per_node =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-node must be a positive integer, got '$ranks_per_node'"
[[ $rate =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]] ||
  die "--rate must be a number with a unit bit|kbit|mbit|gbit (e.g. 100mbit), got '$rate'"
[[ -z $delay || $delay =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || die "--delay must be like 1ms or 500us, got '$delay'"
[ -z "$delay" ] || awk -v d="$delay" 'BEGIN{ n = d + 0; u = d; sub(/^[0-9.]+/, "", u);
  m = (u == "s") ? 1e6 : (u == "ms") ? 1e3 : 1; exit !(n * m <= 5e6) }' ||
  die "--delay must be at most 5s (a frame between nodes waits 2 x D), got '$delay'"
# A loss percentage: below 100, at most two decimals (nftables' rule counts in 1/10000).
loss_percent_ok() { [[ $1 =~ ^[0-9]+(\.[0-9]{1,2})?$ ]] && awk -v p="$1" 'BEGIN{exit !(p < 100)}'; }
[ -z "$loss" ] || loss_percent_ok "$loss" ||
  die "--loss must be a percentage below 100 with at most two decimals (e.g. 2 or 0.25), got '$loss'"
[[ -z $timeout_s || $timeout_s =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive number of seconds, got '$timeout_s'"
for fault in "${faults[@]}"; do
  [[ $fault =~ ^(link-down|kill):[0-9]+@[0-9]+(\.[0-9]+)?$ ||
     $fault =~ ^(slow|loss):[0-9]+:[0-9]+(\.[0-9]+)?@[0-9]+(\.[0-9]+)?$ ]] ||
    die "--fault must be link-down:NODE@S, kill:NODE@S, slow:NODE:FACTOR@S or loss:NODE:PERCENT@S; got '$fault'"
  fault_node=${fault#*:}; fault_node=${fault_node%%[:@]*}
  ((fault_node < nodes)) || die "--fault '$fault' names node $fault_node, but nodes are 0..$((nodes - 1))"
  if [[ $fault == loss:* ]]; then
    fault_loss=${fault#loss:*:}; fault_loss=${fault_loss%@*}
    loss_percent_ok "$fault_loss" ||
      die "--fault '$fault': the loss must be a percentage below 100 with at most two decimals, got '$fault_loss'"
  fi
  ((torch || fault_node > 0)) || [[ $fault != kill:* ]] ||
    die "--fault '$fault': node 0 runs mpirun itself; kill ranks on another node"
done
world=$((nodes * ranks_per_node))

# --- the machine: root, iproute2, tc, the qdiscs the link model needs -----------------
[ "$(id -u)" -eq 0 ] || fail "needs root (network namespaces and tc); run it as root or under sudo"
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "cluster: iproute2 (ip, tc) missing: installing it from apt" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null; } ||
    fail "iproute2 is missing and could not be installed (apt-get install iproute2)"
fi
command -v unshare >/dev/null || fail "unshare (util-linux) is missing"
((torch)) || command -v mpirun >/dev/null || fail "mpirun (Open MPI) is missing: bash scripts/install-deps.sh"

prefix=scpcl-$$
switch_ns=$prefix-sw
made_ns=() tmp_dir= job_pid= fault_pids=() timer_pid= switch_pid=

node_ns() { echo "$prefix-n$1"; }
node_addr() { echo "10.77.0.$(($1 + 1))"; }

# Kills every process in namespace $1 (all of them were started by this script).
kill_namespace() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM HUP
  # The fault and timer subshells first (and their sleeps, which hold the caller's stderr).
  for pid in "${fault_pids[@]}" $timer_pid; do
    pkill -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  [ -z "$job_pid" ] || kill -TERM -- "-$job_pid" 2>/dev/null || true
  if [ -n "$switch_pid" ]; then  # the delay switch ends on TERM, printing its frame counts
    kill -TERM "$switch_pid" 2>/dev/null || true
    wait "$switch_pid" 2>/dev/null || true
  fi
  for ns in "${made_ns[@]}"; do kill_namespace "$ns"; done
  [ -z "$job_pid" ] || wait "$job_pid" 2>/dev/null || true
  for ns in "${made_ns[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  [ -z "$tmp_dir" ] || rm -rf "$tmp_dir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Namespaces of earlier runs whose script died by SIGKILL (no trap ran): their pid is gone.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^scpcl-[0-9]*-' || true); do
  owner=${ns#scpcl-}; owner=${owner%%-*}
  if ! kill -0 "$owner" 2>/dev/null; then
    echo "cluster: removing $ns, left by a run (pid $owner) that was killed" >&2
    kill_namespace "$ns"; ip netns del "$ns" 2>/dev/null || true
  fi
done

# The qdisc on one link end: tbf at RATE, or netem (delay, loss, rate) when asked for
# and the kernel has it (without netem, loss is drop_packets' nftables rule instead).
# tbf's bucket holds 1 ms of traffic (at least 64 KiB: veth hands it offloaded
# segments that large); its queue 20 ms (at least 256 KiB), so a slow link drops
# instead of buffering seconds of traffic.
rate_bits() {  # 100mbit -> 100000000
  awk -v r="$1" 'BEGIN{ n = r + 0; u = r; sub(/^[0-9.]+/, "", u);
    m = (u == "gbit") ? 1e9 : (u == "mbit") ? 1e6 : (u == "kbit") ? 1e3 : 1;
    printf "%d", n * m }'
}
shape() {  # shape NS DEV BITS [LOSS_PERCENT]
  local ns=$1 dev=$2 bits=$3 link_loss=${4:-$loss}
  local burst=$((bits / 8 / 1000)) limit=$((bits / 8 / 50))
  ((burst >= 65536)) || burst=65536
  ((limit >= 262144)) || limit=262144
  if ((have_netem)) && { [ -n "$delay" ] || [ -n "$link_loss" ]; }; then
    ip netns exec "$ns" tc qdisc replace dev "$dev" root netem rate "${bits}bit" \
      ${delay:+delay $delay} ${link_loss:+loss ${link_loss}%} limit 10000 ||
      fail "tc could not set netem on $dev (rate ${bits}bit${delay:+ delay $delay}${link_loss:+ loss $link_loss%})"
  else
    ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${bits}bit" burst "$burst" limit "$limit" ||
      fail "tc could not shape $dev with tbf at ${bits}bit"
  fi
}

# Loss without netem: an nftables rule in node $1's namespace drops each packet leaving
# (output hook) and each packet entering (prerouting) through eth0 with probability
# $2 percent, counting all of them and the dropped ones (loss_counts). Replaces the
# node's earlier rule, if any. Removing the namespace removes the table.
drop_packets() {  # drop_packets NODE PERCENT
  local ns per_10000
  ns=$(node_ns "$1")
  per_10000=$(awk -v p="$2" 'BEGIN{printf "%d", p * 100 + 0.5}')
  ip netns exec "$ns" nft -f - <<EOF || fail "nftables could not install the loss rule on node $1 ($2%)"
table inet scpcl
delete table inet scpcl
table inet scpcl {
  chain out {
    type filter hook output priority 0; policy accept;
    oifname "eth0" counter
    oifname "eth0" numgen random mod 10000 < $per_10000 counter drop
  }
  chain in {
    type filter hook prerouting priority 0; policy accept;
    iifname "eth0" counter
    iifname "eth0" numgen random mod 10000 < $per_10000 counter drop
  }
}
EOF
}
# "dropped D of P packets sent, D of P received" for node $1; nothing without its rule.
loss_counts() {
  local ns sent received
  ns=$(node_ns "$1")
  sent=$(chain_counts "$ns" out) received=$(chain_counts "$ns" in)
  [ -z "$sent" ] || echo "dropped $sent packets sent, $received received"
}
chain_counts() {  # chain_counts NS CHAIN -> "DROPPED of COUNTED"
  ip netns exec "$1" nft list chain inet scpcl "$2" 2>/dev/null |
    awk '{ for (i = 1; i < NF; i++) if ($i == "packets") v[n++] = $(i + 1) }
         END { if (n == 2) print v[1], "of", v[0] }' || true
}

# --- build the cluster -------------------------------------------------------------------
link_bits=$(rate_bits "$rate")
((link_bits >= 8000)) || die "--rate $rate is below 8kbit"
ip netns add "$switch_ns" || fail "cannot create network namespaces here (ip netns add failed)"
made_ns+=("$switch_ns")
# What the link model needs from this kernel, probed in the switch namespace before
# any node exists: netem for --delay; for loss, netem or else nftables.
have_netem=0
if ip netns exec "$switch_ns" tc qdisc add dev lo root netem delay 0ms 2>/dev/null; then
  have_netem=1
  ip netns exec "$switch_ns" tc qdisc del dev lo root 2>/dev/null || true
fi
tmp_dir=$(mktemp -d /tmp/scpcl-$$.XXXXXX)
# --delay without netem: the user-space switch that holds every frame 2 * D.
delay_switch=
if [ -n "$delay" ] && ((!have_netem)); then
  command -v g++ >/dev/null ||
    fail "--delay needs the kernel's netem qdisc, which this kernel lacks, or g++ for the user-space delay switch (apt-get install g++)"
  g++ -O2 -std=c++20 -pthread -o "$tmp_dir/delay_switch" "$(dirname "$0")/cluster_delay_switch.cpp" ||
    fail "--delay: compiling the user-space delay switch (scripts/cluster_delay_switch.cpp) failed"
  delay_switch=$tmp_dir/delay_switch
fi
nft_loss=0
if ((!have_netem)); then
  [ -z "$loss" ] || nft_loss=1
  for fault in "${faults[@]}"; do [[ $fault != loss:* ]] || nft_loss=1; done
fi
if ((nft_loss)); then
  if ! command -v nft >/dev/null; then
    echo "cluster: no netem qdisc here, and nft (nftables) is missing for the loss rule: installing it from apt" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nftables >/dev/null; } ||
      fail "the kernel has no netem qdisc and nftables is missing and could not be installed (apt-get install nftables), so packet loss cannot be emulated here"
  fi
  { ip netns exec "$switch_ns" nft add table inet scpcl_probe &&
    ip netns exec "$switch_ns" nft add chain inet scpcl_probe c '{ type filter hook output priority 0; }' &&
    ip netns exec "$switch_ns" nft add rule inet scpcl_probe c numgen random mod 10000 '<' 1 drop &&
    ip netns exec "$switch_ns" nft delete table inet scpcl_probe; } 2>/dev/null ||
    fail "the kernel has no netem qdisc and nftables' random-drop rule does not work in a network namespace here, so packet loss cannot be emulated"
fi
if [ -z "$delay_switch" ]; then
  ip -n "$switch_ns" link add br0 type bridge
  ip -n "$switch_ns" link set br0 up
fi
for ((i = 0; i < nodes; i++)); do
  ns=$(node_ns "$i")
  ip netns add "$ns"; made_ns+=("$ns")
  ip -n "$ns" link set lo up
  ip -n "$switch_ns" link add "p$i" type veth peer name eth0 netns "$ns"
  if [ -z "$delay_switch" ]; then
    ip -n "$switch_ns" link set "p$i" master br0 up
  else
    ip -n "$switch_ns" link set "p$i" up
  fi
  ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
  ip -n "$ns" link set eth0 up
  # A lost peer ends a connection in about 10 s of retransmissions, not 15 minutes.
  ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_retries2=5 >/dev/null
  shape "$ns" eth0 "$link_bits"
  shape "$switch_ns" "p$i" "$link_bits"
  if ((nft_loss)); then
    # One wire packet per segment, so that one drop loses one packet (sockets take
    # their segment limit from the device when they connect: set before anything runs).
    ip -n "$ns" link set eth0 gso_max_segs 1 ||
      fail "cannot limit eth0's offloaded segments on node $i (ip link set eth0 gso_max_segs 1)"
    [ -z "$loss" ] || drop_packets "$i" "$loss"
  fi
done
delay_by=
if [ -n "$delay_switch" ]; then
  ports=()
  for ((i = 0; i < nodes; i++)); do ports+=("p$i"); done
  # One-way 2 * D between nodes, as netem's D on each of the two link ends a frame crosses.
  delay_us=$(awk -v d="$delay" 'BEGIN{ n = d + 0; u = d; sub(/^[0-9.]+/, "", u);
    m = (u == "s") ? 1e6 : (u == "ms") ? 1e3 : 1; printf "%d", 2 * n * m + 0.5 }')
  ip netns exec "$switch_ns" "$delay_switch" "$delay_us" "${ports[@]}" >"$tmp_dir/switch.out" &
  switch_pid=$!
  for _ in $(seq 100); do  # it prints "ready" once every port is open (at most 10 s)
    grep -q ready "$tmp_dir/switch.out" 2>/dev/null && break
    kill -0 "$switch_pid" 2>/dev/null || break
    sleep 0.1
  done
  grep -q ready "$tmp_dir/switch.out" 2>/dev/null ||
    fail "--delay: the user-space delay switch did not start (its error above)"
  delay_by=" (user-space switch: no netem here)"
fi
loss_by=
if [ -n "$loss" ]; then loss_by=$( ((nft_loss)) && echo " (nftables)" || echo " (netem)"); fi
echo "cluster: $nodes nodes x $ranks_per_node ranks, links $rate${delay:+ delay $delay}$delay_by${loss:+ loss $loss%}$loss_by" \
  "($([ "$torch" = 1 ] && echo "torch/gloo" || echo "Open MPI/TCP"); namespaces $prefix-*)" >&2

# --- faults --------------------------------------------------------------------------------
apply_fault() {  # apply_fault SPEC
  local spec=$1 kind node arg at ns
  at=${spec##*@}; spec=${spec%@*}
  kind=${spec%%:*}; spec=${spec#*:}
  node=${spec%%:*}; arg=
  [[ $spec != *:* ]] || arg=${spec#*:}
  ns=$(node_ns "$node")
  { sleep "$at"; } 2>/dev/null  # no "Terminated" when the job ends first
  case $kind in
    link-down) ip -n "$switch_ns" link set "p$node" down ;;
    kill)
      for pid in $(ip netns pids "$ns" 2>/dev/null); do
        case $(cat "/proc/$pid/comm" 2>/dev/null) in orted|mpirun|prterun) ;; *) kill -9 "$pid" 2>/dev/null || true ;; esac
      done ;;
    slow)
      local slow_bits
      slow_bits=$(awk -v b="$link_bits" -v f="$arg" 'BEGIN{printf "%d", b / f}')
      ((slow_bits >= 8000)) || slow_bits=8000
      shape "$ns" eth0 "$slow_bits"; shape "$switch_ns" "p$node" "$slow_bits" ;;
    loss)
      if ((have_netem)); then
        shape "$ns" eth0 "$link_bits" "$arg"; shape "$switch_ns" "p$node" "$link_bits" "$arg"
      else
        drop_packets "$node" "$arg"
      fi ;;
  esac
  echo "cluster: fault $kind on node $node${arg:+ ($arg)} applied at $at s" >&2
}
# --- run -----------------------------------------------------------------------------------
# A person at a terminal sees the job's progress: mpirun hands ranks a pipe for stderr, so
# say it with SPARSECP_PROGRESS (tools/sparsecp/progress.hpp); nothing changes when piped.
progress_env=()
if [ -t 2 ]; then
  export SPARSECP_PROGRESS=${SPARSECP_PROGRESS:-1}
  echo "cluster: nodes ready; starting the job ($*)" >&2
fi
if [ -n "${SPARSECP_PROGRESS:-}" ]; then progress_env=(-x SPARSECP_PROGRESS); fi
job_started=$SECONDS
set -m  # the job gets its own process group, so cleanup can signal all of it
if ((torch)); then
  master=$(node_addr 0)
  # One process group for the whole job: a subshell that starts and waits for every rank.
  (
    pids=()
    for ((r = 0; r < world; r++)); do
      ip netns exec "$(node_ns $((r / ranks_per_node)))" unshare --uts \
        /bin/sh -c 'hostname "$0" && exec "$@"' "node$((r / ranks_per_node))" env RANK=$r WORLD_SIZE=$world \
        LOCAL_RANK=$((r % ranks_per_node)) LOCAL_WORLD_SIZE=$ranks_per_node \
        MASTER_ADDR="$master" MASTER_PORT=29500 GLOO_SOCKET_IFNAME=eth0 "$@" &
      pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do
      # (no "Killed" line from bash for a rank a fault killed: the ranks print what matters)
      wait "$pid" 2>/dev/null || { s=$?; ((status)) || status=$s; }
    done
    exit "$status"
  ) &
  job_pid=$!
else
  agent=$tmp_dir/netns-agent
  {
    echo '#!/bin/sh'
    echo '# plm_rsh_agent: "ssh HOST COMMAND..." for a node that is a network namespace.'
    echo 'host=$1; shift'
    echo 'case "$host" in'
    for ((i = 0; i < nodes; i++)); do echo "  $(node_addr "$i")) ns=$(node_ns "$i") name=node$i ;;"; done
    echo '  *) echo "netns-agent: unknown host $host" >&2; exit 255 ;;'
    echo 'esac'
    echo '# Its own host name too (a UTS namespace), so shared-memory segment names do not collide.'
    echo 'exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $name && exec /bin/sh -c \"\$0\"" "$*"'
  } >"$agent"
  chmod +x "$agent"
  hosts=
  for ((i = 0; i < nodes; i++)); do hosts+=${hosts:+,}$(node_addr "$i"):$ranks_per_node; done
  ip netns exec "$(node_ns 0)" unshare --uts /bin/sh -c 'hostname node0 && exec "$@"' mpirun mpirun --allow-run-as-root --oversubscribe --bind-to none \
    -np "$world" --host "$hosts" \
    --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 --mca btl self,vader,tcp \
    --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 5 \
    "${progress_env[@]}" "$@" &
  job_pid=$!
fi
set +m
for fault in "${faults[@]}"; do
  apply_fault "$fault" &
  fault_pids+=($!)
done
if [ -n "$timeout_s" ]; then
  # The mark is made before the job is stopped: the job's end can be seen before the timer
  # has finished stopping the namespaces' processes, so the timer's own exit cannot tell.
  ({ sleep "$timeout_s"; } 2>/dev/null; echo "cluster: --timeout $timeout_s s reached: stopping the job" >&2
   : > "$tmp_dir/timed-out"
   kill -TERM -- "-$job_pid" 2>/dev/null; for ns in "${made_ns[@]}"; do kill_namespace "$ns"; done) &
  timer_pid=$!
fi
status=0
wait "$job_pid" 2>/dev/null || status=$?  # (a job killed by --timeout is reported below)
job_pid=
if [ -t 2 ]; then echo "cluster: the job ended after $((SECONDS - job_started)) s (exit status $status)" >&2; fi
# What crossed the links (MPI's or gloo's data plus the launcher's own small traffic).
for ((i = 0; i < nodes; i++)); do
  stats=/sys/class/net/eth0/statistics
  dropped=$(loss_counts "$i")
  echo "cluster: node $i link: sent $(ip netns exec "$(node_ns "$i")" cat $stats/tx_bytes) bytes," \
    "received $(ip netns exec "$(node_ns "$i")" cat $stats/rx_bytes) bytes${dropped:+; $dropped}" >&2
done
if [ -e "$tmp_dir/timed-out" ]; then status=124; fi
exit "$status"
