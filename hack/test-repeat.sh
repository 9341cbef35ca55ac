#!/usr/bin/env bash
# Runs one test tier N times in a row and counts, per test, how often it
# passed and failed. A test that fails even once is flaky: its logs are kept.
# Usage: hack/test-repeat.sh N TIER      (make test-repeat N=20 TIER=kube)
set -uo pipefail
cd "$(dirname "$0")/.."

n=${1:?usage: hack/test-repeat.sh N TIER}
tier=${2:?usage: hack/test-repeat.sh N TIER}
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "N must be a positive number, not '$n'" >&2; exit 2; }

out=${CARINA_TEST_LOG_DIR:-target/test-logs}/repeat-$tier
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)

declare -A PASS FAIL SKIP
runs_failed=0
start=$SECONDS
for i in $(seq 1 "$n"); do
  run_dir="$out/run-$i"
  mkdir -p "$run_dir"
  CARINA_TEST_LOG_DIR="$run_dir" hack/test.sh "$tier" >"$run_dir/output.log" 2>&1
  rc=$?
  # Tests that returned early (carina_tests::skip): libtest says ok.
  declare -A skipped=()
  if [ -s "$run_dir/$tier.skipped" ]; then
    while IFS=$'\t' read -r _ name _; do skipped[$name]=1; done <"$run_dir/$tier.skipped"
  fi
  # libtest's per-test lines: `test <name> ... ok` / `... FAILED`.
  while read -r name result; do
    case $result in
      ok) if [ -n "${skipped[$name]:-}" ]; then
            SKIP[$name]=$(( ${SKIP[$name]:-0} + 1 ))
          else
            PASS[$name]=$(( ${PASS[$name]:-0} + 1 ))
          fi ;;
      FAILED) FAIL[$name]=$(( ${FAIL[$name]:-0} + 1 )) ;;
    esac
  done < <(sed -n 's/^test \([^ ]*\) \.\.\. \(ok\|FAILED\)$/\1 \2/p' "$run_dir/output.log")
  if ! grep -q '^test .* \.\.\. ' "$run_dir/output.log"; then
    echo "run $i/$n: the tier ran no test (build failure?); see $run_dir/output.log" >&2
    exit 1
  fi
  if [ "$rc" -ne 0 ]; then
    runs_failed=$((runs_failed + 1))
    echo "run $i/$n: FAILED (logs in $run_dir)"
  else
    echo "run $i/$n: ok"
    rm -rf "$run_dir"
  fi
done

echo
echo "=== $tier tier, $n runs in $(( (SECONDS - start) / 60 )) min"
printf '%-70s %6s %6s %7s\n' test passed failed skipped
total_pass=0 total_fail=0 total_skip=0
for name in $(printf '%s\n' "${!PASS[@]}" "${!FAIL[@]}" "${!SKIP[@]}" | sort -u); do
  p=${PASS[$name]:-0} f=${FAIL[$name]:-0} s=${SKIP[$name]:-0}
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
  printf '%-70s %6s %6s %7s\n' "$name" "$p" "$f" "$s"
done
echo "runs: $((n - runs_failed)) of $n passed"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$runs_failed" -eq 0 ]
