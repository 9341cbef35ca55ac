#!/usr/bin/env bash
# Runs every test tier and prints how many tests ran in each, then scans
# every log of the run for key material (hack/scan-logs.sh).
# Usage: hack/test.sh [tier...]   tiers: the rows of tests/tiers.tsv (default: all, in that order)
set -uo pipefail
cd "$(dirname "$0")/.."

LOG_DIR=${CARINA_TEST_LOG_DIR:-target/test-logs}
mkdir -p "$LOG_DIR"

tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || mapfile -t tiers < <(awk -F'\t' '!/^#/ && NF { print $1 }' tests/tiers.tsv)

# Integration test targets of a tier: tests/tests/<prefix>_*.rs
targets() {
  local prefix=$1 f args=()
  for f in tests/tests/"$prefix"_*.rs; do
    [ -e "$f" ] || continue
    args+=(--test "$(basename "$f" .rs)")
  done
  printf '%s\n' "${args[@]}"
}

declare -A PASSED FAILED IGNORED STATUS
total_passed=0 total_failed=0 total_ignored=0 overall=0

# A tier that could not even start (its build failed) counts as one failure.
tier_error() {
  local tier=$1
  PASSED[$tier]=0; FAILED[$tier]=1; IGNORED[$tier]=0
  total_failed=$((total_failed + 1))
  overall=1
}

run_tier() {
  local tier=$1; shift
  local log="$LOG_DIR/$tier.log"
  echo "=== tier: $tier ($*)"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local p f i
  read -r p f i < <(awk '/^test result:/ {
      for (k = 1; k <= NF; k++) {
        if ($k ~ /^passed/) p += $(k-1); if ($k ~ /^failed/) f += $(k-1); if ($k ~ /^ignored/) i += $(k-1)
      }
    } END { print p+0, f+0, i+0 }' "$log")
  PASSED[$tier]=${p:-0}; FAILED[$tier]=${f:-0}; IGNORED[$tier]=${i:-0}
  if [ "$rc" -ne 0 ] && [ "${FAILED[$tier]}" = 0 ]; then
    # A build failure or crash counts as one failure of the tier.
    FAILED[$tier]=1
  fi
  STATUS[$tier]=$rc
  total_passed=$((total_passed + PASSED[$tier]))
  total_failed=$((total_failed + FAILED[$tier]))
  total_ignored=$((total_ignored + IGNORED[$tier]))
  [ "$rc" -eq 0 ] || overall=1
}

# The tier table: what each tier builds first and how it runs.
declare -A BINS TOOLS ARGS
while IFS=$'\t' read -r name bins tools args; do
  [[ -z $name || $name == \#* ]] && continue
  BINS[$name]=$bins; TOOLS[$name]=$tools; ARGS[$name]=$args
done < tests/tiers.tsv

for tier in "${tiers[@]}"; do
  if [ -z "${ARGS[$tier]+x}" ]; then
    echo "unknown tier: $tier (tiers: ${!ARGS[*]})" >&2; exit 2
  fi
  # Everything the tier runs is built here, so it passes on a machine
  # where no earlier tier ran (the upstream tools are cached by version).
  if [ "${BINS[$tier]}" = yes ]; then
    cargo build --workspace --bins || { tier_error "$tier"; continue; }
  fi
  if [ "${TOOLS[$tier]}" != - ]; then
    IFS=, read -r -a tools <<<"${TOOLS[$tier]}"
    tests/tools/build.sh "${tools[@]}" || { tier_error "$tier"; continue; }
  fi
  # `@prefix` stands for every tests/tests/<prefix>_*.rs target.
  args=()
  for a in ${ARGS[$tier]}; do
    if [[ $a == @* ]]; then
      mapfile -t t < <(targets "${a#@}")
      args+=("${t[@]}")
    else
      args+=("$a")
    fi
  done
  CARINA_TEST_LOG_DIR="$(cd "$LOG_DIR" && pwd)" run_tier "$tier" cargo test "${args[@]}"
  if [ "$tier" = sanity ]; then
    grep -o 'csi-sanity [a-z-]*: ran.*' "$LOG_DIR/sanity.log" || true
  fi
done

# Last: no log of this run (tier logs and the logs of the processes the
# tests started, kept under $LOG_DIR) may hold key material. A hit fails
# the run and counts as one failure.
echo "=== scan: key material in $LOG_DIR"
scan=clean
if ! hack/scan-logs.sh "$LOG_DIR"; then
  scan=failed
  total_failed=$((total_failed + 1))
  overall=1
fi

echo
echo "=== summary"
printf '%-10s %8s %8s %8s\n' tier passed failed ignored
for tier in "${tiers[@]}"; do
  [ -n "${PASSED[$tier]+x}" ] || continue
  printf '%-10s %8s %8s %8s\n' "$tier" "${PASSED[$tier]}" "${FAILED[$tier]}" "${IGNORED[$tier]}"
done
echo "log scan: $scan"
echo "$total_passed passed, $total_failed failed, $total_ignored skipped"
exit $overall
