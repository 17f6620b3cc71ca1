#!/usr/bin/env bash
# Bad inputs against the CLI: runs every case of cli_limits.cases against a built
# `sparsecp` and prints a Markdown table (exit status, seconds, peak RSS, stderr).
# Usage: fuzz/cli_limits.sh BUILD/sparsecp [DATA_DIR]   (run from anywhere)
# DATA_DIR holds the bad files the cases name ($D); fuzz/make_bad_inputs.py writes them.
# A case "passes" when it exits 2 with exactly one stderr line starting "error: ",
# within the time limit and under 1 GiB of memory (address space capped at 4 GiB, or
# CLI_LIMITS_VMEM KiB: "unlimited" for sanitizer builds);
# a "valid:" case passes when it exits 0 with nothing on stderr, within the same limits.
# Cases under mpirun pass when every rank prints the same error line and mpirun exits 2.
set -uo pipefail
tool=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
D=${2:-$(mktemp -d)}
[ -f "$D/k.npy" ] || python3 "$here/make_bad_inputs.py" "$D"
export D
limit=${CLI_LIMITS_TIMEOUT:-20}
echo "| command | exit | s | peak RSS MiB | stderr | ok |"
echo "|---|---|---|---|---|---|"
fails=0
while IFS= read -r line; do
  [[ -z "$line" || "$line" == \#* ]] && continue
  expected=2
  if [[ "$line" == valid:* ]]; then
    expected=0
    line=${line#valid: }
  fi
  cmd=${line//sparsecp /$tool }
  cmd=${cmd//\$D/$D}
  start=$(date +%s.%N)
  err=$( (ulimit -v "${CLI_LIMITS_VMEM:-4194304}"; OMP_NUM_THREADS=2 /usr/bin/time -f 'RSS %M' -o /tmp/cli_limits.rss \
          timeout "$limit" bash -c "$cmd" >/dev/null </dev/null) 2>&1 )
  status=$?
  seconds=$(printf '%.2f' "$(echo "$(date +%s.%N) - $start" | bc)")
  rss=$(awk '/RSS/ {printf "%d", $2/1024}' /tmp/cli_limits.rss 2>/dev/null)
  lines=$(printf '%s' "$err" | grep -c '')
  first=$(printf '%s' "$err" | head -1 | cut -c1-160 | sed 's/|/\\|/g')
  ok=yes
  if [[ "$line" == mpirun* ]]; then
    # Every rank prints its own error line and mpirun adds a banner; require exit 2,
    # the same error line from every rank that printed one, and no crash report.
    errors=$(printf '%s\n' "$err" | grep '^error:' | sort -u)
    count=$(printf '%s\n' "$err" | grep -c '^error:')
    first=$(printf '%s' "$errors" | head -1 | cut -c1-240 | sed 's/|/\\|/g')
    if [ "$status" -ne 2 ] || [ -z "$errors" ] || [ "$(printf '%s\n' "$errors" | grep -c '')" -gt 1 ] ||
       printf '%s' "$err" | grep -qE 'Segmentation|terminate called|Sanitizer|runtime error|Abort'; then
      ok=NO; fails=$((fails + 1))
    fi
    first="$first ($count ranks)"
  elif [ "$expected" -eq 0 ]; then
    # A valid extreme: must succeed quietly, within the same time and memory limits.
    if [ "$status" -ne 0 ] || [ "$lines" -gt 0 ] || [ "${rss:-0}" -gt 1024 ]; then
      ok=NO; fails=$((fails + 1))
    fi
    first="(valid input) $first"
  else
    if [ "$status" -ne 2 ] || [ "$lines" -gt 1 ] || [[ "$first" != error:* ]] || [ "${rss:-0}" -gt 1024 ]; then
      ok=NO; fails=$((fails + 1))
    fi
    [ "$lines" -gt 1 ] && first="$first (+$((lines - 1)) lines)"
  fi
  shown=${line//|/\\|}
  echo "| \`$shown\` | $status | $seconds | ${rss:-?} | $first | $ok |"
done < "${CLI_LIMITS_CASES:-$here/cli_limits.cases}"
echo
echo "cases not answered as expected: $fails"
