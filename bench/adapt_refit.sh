#!/usr/bin/env bash
# The timing case of `sparsecp run --adapt` (the CTest tests inject the times instead:
# cli_run_adapt*.np3 in tests/CMakeLists.txt): how often a refit of this machine's measured
# per-rank selection times passes the residual bound (0.25), over repeated small jobs.
# Under load a refit can rightly be refused (the job keeps the previous model); this counts it.
#
#   bash bench/adapt_refit.sh BUILD/sparsecp [RUNS (10)] [RANKS (3)]
# Prints each run's per-step residual and verdict, then the accepted steps out of all.
set -euo pipefail
cli=${1:?usage: adapt_refit.sh PATH/TO/sparsecp [runs] [ranks]}
runs=${2:-10}
ranks=${3:-3}
accepted=0 steps=0
for run in $(seq 1 "$runs"); do
  out=$(OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0 mpiexec --allow-run-as-root --oversubscribe -np "$ranks" \
        "$cli" run --mode spill --adapt 2 --tokens 3000 --heads 2 --head-dim 16 --rope-dim 8 --q-rank 12 \
        --topk 9 --repeats 1 --max-repeats 1 --no-cache --json)
  line=$(python3 -c '
import json, sys
report = json.loads(sys.stdin.read())
steps = report["adapt"]
print(sum(not s["kept_previous"] for s in steps), len(steps),
      " ".join("step %d: %s %.3f" % (s["step"], "kept" if s["kept_previous"] else "refitted",
                                     s["refused_rms_relative_residual"] or s["rms_relative_residual"])
               for s in steps), "verified" if report["verified"] else "NOT VERIFIED")
' <<<"$out")
  read -r ok total rest <<<"$line"
  accepted=$((accepted + ok)) steps=$((steps + total))
  echo "run $run: $rest"
done
echo "adapt_refit: $accepted of $steps refits accepted (load average $(cut -d' ' -f1-3 /proc/loadavg))"
