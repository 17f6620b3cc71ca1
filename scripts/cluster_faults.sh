#!/usr/bin/env bash
# Faults on the cluster (scripts/cluster.sh): a link set down in the middle of the
# exchanges, a node's ranks killed, a link slowed 100x, and 2% packet loss (netem, or
# an nftables drop rule where the kernel has no netem), each under Open MPI (`sparsecp run`) and under torch/gloo
# (scripts/cluster_gloo_job.py), on 2 nodes x 2 ranks. Prints, per fault, the exit
# status, the seconds from the fault to the job's end, whether every strategy was still
# verified bit for bit, and every line the ranks and the launcher printed about the failure.
# Usage: bash scripts/cluster_faults.sh [--only KIND,...] [mpi|torch]...   (default: both)
#   --only KIND,...   only these faults: none, link-down, kill, slow, loss (e.g. --only loss)
# Needs the release tool (build/release/sparsecp) and, for torch, .venv (scripts/pytest.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
only=
if [ "${1:-}" = --only ]; then
  only=${2:?--only needs a list of faults: none, link-down, kill, slow, loss}
  shift 2
  for kind in ${only//,/ }; do
    case $kind in none|link-down|kill|slow|loss) ;; *) echo "cluster_faults: unknown fault '$kind' in --only (none, link-down, kill, slow, loss)" >&2; exit 2 ;; esac
  done
fi
paths=("$@"); ((${#paths[@]})) || paths=(mpi torch)
for path in "${paths[@]}"; do
  case $path in mpi|torch) ;; *) echo "cluster_faults: unknown path '$path' (mpi or torch)" >&2; exit 2 ;; esac
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
mpi_job=(env OMP_NUM_THREADS=1 build/release/sparsecp run --tokens 8000 --heads 2 --head-dim 16 --rope-dim 8
         --q-rank 12 --topk 9 --repeats 40 --max-repeats 40 --no-calibrate)
torch_job=(env OMP_NUM_THREADS=1 .venv/bin/python scripts/cluster_gloo_job.py --steps 60 --timeout 20)
# Faults land in the middle of the job: at half the time the `none` run just before took
# to finish (MID below), so that they hit the steps on a fast machine and a loaded one
# alike (40 MPI repeats take about 10 s on a quiet 2-core machine, the Python ranks start
# in 3-15 s); without a `none` run (--only), at 6 s (MPI) and 20 s (torch). Loss is a
# condition, not an event: it starts at 1 s, before the ranks connect, so that every
# exchange of the job runs under it however fast the job is.
mpi_faults=(none link-down:1@MID kill:1@MID slow:1:100@MID loss:1:2@1)
torch_faults=(none link-down:1@MID kill:1@MID slow:1:100@MID loss:1:2@1)
job_seconds=  # how long the last run took to end (run_one sets it)

run_one() {  # run_one PATH FAULT -> one table row
  local path=$1 fault=$2 log=$logs/$1-${2%%[:@]*}.log fault_args=() job launch=()
  [ "$fault" = none ] || fault_args=(--fault "$fault")
  if [ "$path" = torch ]; then launch=(--torch); job=("${torch_job[@]}"); else job=("${mpi_job[@]}"); fi
  local start=$EPOCHREALTIME
  bash scripts/cluster.sh --nodes 2 --ranks-per-node 2 --rate 200mbit --timeout 240 "${launch[@]}" \
    "${fault_args[@]}" -- "${job[@]}" 2>&1 | while IFS= read -r line; do
      printf '%.1f|%s\n' "$(bc <<<"$EPOCHREALTIME - $start")" "$line"; done >"$log"
  local status=${PIPESTATUS[0]}
  local applied end
  applied=$(grep -m1 'cluster: fault' "$log" | cut -d'|' -f1)
  end=$(grep 'cluster: node 0 link' "$log" | cut -d'|' -f1)
  local to_end=n/a
  [ -z "$applied" ] || [ -z "$end" ] || to_end=$(bc <<<"$end - $applied")
  job_seconds=$end
  local verified=no
  if [ "$path" = mpi ]; then
    grep -q 'verified: every strategy' "$log" && verified=yes
  else
    (($(grep -o 'steps verified bit for bit' "$log" | wc -l) == 12)) && verified=yes
    grep -q 'error after' "$log" && verified="no (a rank stopped: below)"
  fi
  echo "### $path, fault $fault: exit $status, fault at ${applied:-n/a} s, job ended ${to_end} s after it, every result verified: $verified"
  grep -v '^[0-9.]*|  \|^[0-9.]*|$\|^[0-9.]*|-----' "$log" |
    grep -v 'frame #' | grep -i -E 'error|fault|lost|noticed|abort|killed|timeout|timed out|verified|netem|dropped' |
    sed 's/^/    /' | cut -c1-400 | head -16
}
for path in "${paths[@]}"; do
  if [ "$path" = torch ]; then faults=("${torch_faults[@]}") mid=20; else faults=("${mpi_faults[@]}") mid=6; fi
  for fault in "${faults[@]}"; do
    [ -z "$only" ] || [[ ,$only, == *,${fault%%[:@]*},* ]] || continue
    run_one "$path" "${fault/@MID/@$mid}"
    if [ "$fault" = none ] && [ -n "$job_seconds" ]; then
      mid=$(awk -v t="$job_seconds" 'BEGIN{printf "%.1f", t / 2}')
    fi
  done
done
