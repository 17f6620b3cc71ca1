#!/usr/bin/env bash
# The cluster on one machine (scripts/cluster.sh), end to end and in seconds:
#  1. `sparsecp run` on 2 nodes x 2 ranks over shaped 200 Mbit/s links: every strategy
#     verified bit for bit, the route's bytes moved, and real bytes crossed the links;
#  2. COMMAND's exit status comes back;
#  3. --timeout stops a hung job (exit 124);
#  4. SIGTERM to the script mid-run;
#  5-6. a link set down and a node's ranks killed mid-run: the job ends within 30 s;
#  7. 2% packet loss on every link (netem, or the nftables rule without it): still every
#     strategy verified bit for bit, and packets were dropped;
#  7b. a link slowed 100x from the start: still verified bit for bit;
#  8. --delay 5ms (netem, or the user-space delay switch without it): a TCP round trip
#     between two nodes takes 4 x 5 ms, and `sparsecp run` still verifies bit for bit under 2 ms;
# and after each, none of the run's namespaces is left, nor an nftables table of the
# script's in this machine's own namespace. Exits 77 (CTest SKIP_RETURN_CODE)
# with the reason where network namespaces or tc are unavailable (not root, a container).
# Usage: cluster_test.sh SOURCE_DIR SPARSECP_BINARY
set -uo pipefail
source_dir=$1 sparsecp=$2
cluster=(bash "$source_dir/scripts/cluster.sh")
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: not root: network namespaces and tc need root"; exit 77; fi
probe=$("${cluster[@]}" --nodes 2 --ranks-per-node 1 --rate 1gbit --torch -- true 2>&1)
case $? in
  0) ;;
  3) echo "SKIP: the cluster cannot be built here: $probe"; exit 77 ;;
  *) echo "FAIL: the cluster probe failed: $probe"; exit 1 ;;
esac

# The run's namespaces (named in the script's first line) must all be gone.
check_clean() {  # check_clean LOG WHAT
  local prefix
  prefix=$(grep -o 'namespaces scpcl-[0-9]*-' "$1" | head -1 | cut -d' ' -f2)
  [ -n "$prefix" ] || { fail "$2: no namespace line in the output"; return; }
  if ip netns list | grep -q "^$prefix"; then fail "$2: namespaces left behind: $(ip netns list | grep "^$prefix" | tr '\n' ' ')"; fi
  if command -v nft >/dev/null && nft list tables 2>/dev/null | grep -q scpcl; then
    fail "$2: an nftables table of the script's in the root namespace: $(nft list tables | grep scpcl | tr '\n' ' ')"
  fi
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The small job most cases run: `sparsecp run` (one repeat, JSON) on 2 nodes x 2 ranks at
# 200 Mbit/s, with the case's own link options (--loss, --delay, --fault); output in $log.
small_run() {  # small_run CLUSTER_OPTION... -> the script's exit status
  "${cluster[@]}" --nodes 2 --ranks-per-node 2 --rate 200mbit --timeout 120 "$@" -- \
    env ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 "$sparsecp" run --tokens 8000 --heads 2 \
    --head-dim 16 --rope-dim 8 --q-rank 12 --topk 9 --repeats 1 --max-repeats 1 --no-calibrate --json \
    >"$log" 2>&1
}

# 1. The main job across two shaped nodes.
start=$(date +%s)
small_run
status=$?
echo "run: exit $status in $(($(date +%s) - start)) s"
((status == 0)) || { fail "sparsecp run on the cluster exited $status"; cat "$log"; }
grep -q '"verified": true' "$log" || fail "no '\"verified\": true' in the run's report"
if grep -q '"verified": false\|"bytes_match_route": false' "$log"; then fail "a strategy was not verified"; fi
# Every strategy reports its step's wall time and its exchanges' (medians > 0).
steps=$(grep -c '"step_wall_s"\|"exchange_s"' "$log")
((steps == 6)) || fail "want step_wall_s and exchange_s for none, hybrid and spill, found $steps"
awk '/"(step_wall_s|exchange_s)"/ {inside = 1} /"median"/ && inside {if ($2 + 0 <= 0) bad = 1; inside = 0}
     END {exit bad}' "$log" || fail "a step_wall_s or exchange_s median is not positive"
sent=$(grep -o 'node 1 link: sent [0-9]*' "$log" | grep -o '[0-9]*$')
# hybrid alone moves ~0.3 MB between the two nodes (ranks 0,1 <-> 2,3) each way.
[ -n "$sent" ] && ((sent > 100000)) || fail "node 1 sent ${sent:-no} bytes over its link: the data did not cross it"
grep 'cluster: node' "$log"
check_clean "$log" "run"

# 2. COMMAND's status is the script's.
"${cluster[@]}" --nodes 2 --ranks-per-node 1 --rate 1gbit -- sh -c 'exit 7' >"$log" 2>&1
status=$?
((status == 7)) || fail "a COMMAND exiting 7 made the script exit $status"
check_clean "$log" "exit status"

# 3. A hung job is stopped by --timeout.
start=$(date +%s)
"${cluster[@]}" --nodes 2 --ranks-per-node 1 --rate 1gbit --timeout 2 --torch -- sleep 60 >"$log" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
((status == 124 && elapsed < 20)) || fail "--timeout 2 on 'sleep 60': exit $status after $elapsed s (want 124, soon)"
check_clean "$log" "timeout"

# 4. SIGTERM to the script while its job runs: everything is removed, exit 143.
"${cluster[@]}" --nodes 3 --ranks-per-node 1 --rate 1gbit -- sleep 60 >"$log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q 'namespaces scpcl' "$log" && break; sleep 0.1; done
sleep 1
kill -TERM "$pid"
wait "$pid"
status=$?
((status == 143)) || fail "SIGTERM: the script exited $status (want 143)"
check_clean "$log" "SIGTERM"

# 5-6. Faults in the middle of the exchanges: a link set down, a node's ranks killed.
# The job must end (no hang) within 30 s of the fault, with Open MPI's runtime naming it.
fault_run() {  # fault_run FAULT EXPECTED_TEXT
  start=$(date +%s)
  "${cluster[@]}" --nodes 2 --ranks-per-node 2 --rate 200mbit --timeout 90 --fault "$1" -- \
    env ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 "$sparsecp" run --tokens 8000 --heads 2 \
    --head-dim 16 --rope-dim 8 --q-rank 12 --topk 9 --repeats 300 --max-repeats 300 --time-budget 600 --no-calibrate \
    >"$log" 2>&1
  status=$?
  elapsed=$(($(date +%s) - start))
  echo "fault $1: exit $status after $elapsed s"
  ((status != 0 && status != 124 && elapsed < 3 + 30)) ||
    fail "fault $1: exit $status after $elapsed s (want a failure, not --timeout, within 30 s of the fault)"
  grep -q 'cluster: fault' "$log" || fail "fault $1 was never applied (the run ended first?)"
  grep -q "$2" "$log" || { fail "fault $1: no '$2' in the output"; tail -20 "$log"; }
  check_clean "$log" "fault $1"
}
fault_run link-down:1@3 "lost communication with a remote daemon"
fault_run kill:1@3 "exited on signal 9"

# 7. Packet loss on every link end: TCP retransmits, the results stay bit-exact.
start=$(date +%s)
small_run --loss 2
status=$?
echo "loss 2%: exit $status in $(($(date +%s) - start)) s"
if grep -q 'loss 2% (netem)' "$log"; then
  echo "loss 2%: by netem (no drop counts to check)"
else
  grep 'cluster: node' "$log"
  dropped=$(grep -o 'dropped [0-9]* of [0-9]* packets sent, [0-9]* of [0-9]*' "$log" |
    awk '{ d += $2 + $7 } END { print d + 0 }')
  ((dropped > 0)) || fail "--loss 2: no packet was dropped (want the nftables rule's drop counts > 0)"
fi
((status == 0)) || { fail "sparsecp run under 2% loss exited $status"; tail -30 "$log"; }
grep -q '"verified": true' "$log" || fail "under 2% loss: no '\"verified\": true' in the run's report"
if grep -q '"verified": false\|"bytes_match_route": false' "$log"; then fail "under 2% loss: a strategy was not verified"; fi
check_clean "$log" "loss"

# 7b. A link slowed 100x from the start (200 -> 2 Mbit/s): slower, still bit-exact.
start=$(date +%s)
small_run --fault slow:1:100@0.5
status=$?
echo "slow 100x: exit $status in $(($(date +%s) - start)) s"
((status == 0)) || { fail "sparsecp run over a link slowed 100x exited $status"; tail -30 "$log"; }
grep -q 'cluster: fault slow on node 1' "$log" || fail "the slow fault was never applied"
grep -q '"verified": true' "$log" || fail "over a slowed link: no '\"verified\": true' in the run's report"
check_clean "$log" "slow"

# 8. A link delay: D on each of the two link ends a frame crosses, so a round trip is 4 D.
rtt_job=$(mktemp)
trap 'rm -f "$log" "$rtt_job"' EXIT
cat >"$rtt_job" <<'EOF'
import os, socket, statistics, time
rank, address = int(os.environ["RANK"]), os.environ["MASTER_ADDR"]
if rank == 0:
    server = socket.create_server((address, 29600))
    peer, _ = server.accept()
    while data := peer.recv(64):
        peer.sendall(data)
else:
    for _ in range(100):
        try:
            peer = socket.create_connection((address, 29600))
            break
        except OSError:
            time.sleep(0.1)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(20):
        start = time.perf_counter()
        peer.sendall(b"x")
        peer.recv(64)
        rtts.append(time.perf_counter() - start)
    print(f"round trip median {statistics.median(rtts) * 1e3:.2f} ms", flush=True)
EOF
"${cluster[@]}" --nodes 2 --ranks-per-node 1 --rate 1gbit --delay 5ms --torch --timeout 60 -- \
  python3 "$rtt_job" >"$log" 2>&1
status=$?
if ((status == 3)); then  # neither netem nor a compiler for the delay switch here
  echo "delay: SKIPPED, the cluster cannot delay links here: $(grep -m1 -- '--delay' "$log")"
else
rtt=$(grep -o 'round trip median [0-9.]*' "$log" | grep -o '[0-9.]*$')
echo "delay 5ms: exit $status, round trip ${rtt:-not measured} ms ($(grep -o 'delay 5ms[^;(]*([^)]*)' "$log" | head -1))"
((status == 0)) || { fail "--delay 5ms: the round-trip job exited $status"; tail -20 "$log"; }
[ -n "$rtt" ] && awk -v r="$rtt" 'BEGIN { exit !(r >= 18 && r < 80) }' ||
  fail "--delay 5ms: round trip ${rtt:-not measured} ms, want about 20 ms (4 x 5 ms)"
check_clean "$log" "delay (round trip)"
small_run --delay 2ms
status=$?
echo "delay 2ms: sparsecp run exit $status"
((status == 0)) || { fail "sparsecp run under --delay 2ms exited $status"; tail -30 "$log"; }
grep -q '"verified": true' "$log" || fail "under --delay 2ms: no '\"verified\": true' in the run's report"
check_clean "$log" "delay (run)"
fi

((failures == 0)) && echo "cluster_test: all checks passed" || { echo "cluster_test: $failures failure(s)"; exit 1; }
