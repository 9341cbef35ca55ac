#!/usr/bin/env bash
# Runs every test tier and prints how many tests ran in each, then scans
# every log of the run for key material (hack/scan-logs.sh).
# Usage: hack/test.sh [tier...]   tiers: the rows of tests/tiers.tsv (default: all, in that order)
#
# A test that cannot run here (outside CI, e.g. without root) records
# itself in $CARINA_TEST_SKIP_FILE (carina_tests::skip) and returns: libtest
# calls it passed, the summary counts it as skipped. A tier that runs no
# test fails. Every tier but `unit` needs root: as another user the run
# stops before it starts, unless CARINA_TEST_ALLOW_SKIP=1 asks to run them
# with their tests skipped. CARINA_TIERS_FILE names another tier table
# (to try this runner itself).
set -uo pipefail
cd "$(dirname "$0")/.."

LOG_DIR=${CARINA_TEST_LOG_DIR:-target/test-logs}
# One name per run: what a test process builds for the run (the images of
# the node tiers) the next one may keep (carina_tests::local::carina_images).
export CARINA_TEST_RUN=${CARINA_TEST_RUN:-$(date +%s)-$$}
mkdir -p "$LOG_DIR"
TIERS_FILE=${CARINA_TIERS_FILE:-tests/tiers.tsv}
# The tiers whose tests need neither root nor loop devices.
NO_ROOT_TIERS=" unit "

tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || mapfile -t tiers < <(awk -F'\t' '!/^#/ && NF { print $1 }' "$TIERS_FILE")

# Integration test targets of a tier: tests/tests/<prefix>_*.rs
targets() {
  local prefix=$1 f args=()
  for f in tests/tests/"$prefix"_*.rs; do
    [ -e "$f" ] || continue
    args+=(--test "$(basename "$f" .rs)")
  done
  [ ${#args[@]} -eq 0 ] || printf '%s\n' "${args[@]}"
}

declare -A PASSED FAILED IGNORED SKIPPED STATUS
total_passed=0 total_failed=0 total_ignored=0 total_skipped=0 overall=0

# A tier that could not even start (its build failed) counts as one failure.
tier_error() {
  local tier=$1
  PASSED[$tier]=0; FAILED[$tier]=1; IGNORED[$tier]=0; SKIPPED[$tier]=0
  total_failed=$((total_failed + 1))
  overall=1
}

# The tests of skip file $1 (`binary<TAB>test<TAB>reason` lines), each once.
skipped_tests() {
  [ -s "$1" ] || return 0
  awk -F'\t' '!seen[$1 FS $2]++' "$1"
}

run_tier() {
  local tier=$1; shift
  local log="$LOG_DIR/$tier.log"
  local skip_file
  skip_file="$(cd "$LOG_DIR" && pwd)/$tier.skipped"
  echo "=== tier: $tier ($*)"
  CARINA_TEST_SKIP_FILE="$skip_file" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local p f i s
  read -r p f i < <(awk '/^test result:/ {
      for (k = 1; k <= NF; k++) {
        if ($k ~ /^passed/) p += $(k-1); if ($k ~ /^failed/) f += $(k-1); if ($k ~ /^ignored/) i += $(k-1)
      }
    } END { print p+0, f+0, i+0 }' "$log")
  PASSED[$tier]=${p:-0}; FAILED[$tier]=${f:-0}; IGNORED[$tier]=${i:-0}
  # A test that returned early (carina_tests::skip) is skipped, not passed.
  s=$(skipped_tests "$skip_file" | wc -l)
  [ "$s" -le "${PASSED[$tier]}" ] || s=${PASSED[$tier]}
  SKIPPED[$tier]=$s
  PASSED[$tier]=$((PASSED[$tier] - s))
  if [ "$rc" -ne 0 ] && [ "${FAILED[$tier]}" = 0 ]; then
    # A build failure or crash counts as one failure of the tier.
    FAILED[$tier]=1
  fi
  if [ "${PASSED[$tier]}" -eq 0 ] && [ "${FAILED[$tier]}" -eq 0 ]; then
    # Nothing was tested: a tier that ran no test fails.
    echo "tier $tier ran no test (${SKIPPED[$tier]} skipped, ${IGNORED[$tier]} ignored): a failure" >&2
    FAILED[$tier]=1
    rc=1
  fi
  STATUS[$tier]=$rc
  total_passed=$((total_passed + PASSED[$tier]))
  total_failed=$((total_failed + FAILED[$tier]))
  total_ignored=$((total_ignored + IGNORED[$tier]))
  total_skipped=$((total_skipped + SKIPPED[$tier]))
  [ "$rc" -eq 0 ] || overall=1
}

# The tier table: what each tier builds first and how it runs.
declare -A BINS TOOLS ARGS
while IFS=$'\t' read -r name bins tools args; do
  [[ -z $name || $name == \#* ]] && continue
  BINS[$name]=$bins; TOOLS[$name]=$tools; ARGS[$name]=$args
done < "$TIERS_FILE"

# Every tier asked for is checked before any runs: a known name, and each
# `@prefix` (every tests/tests/<prefix>_*.rs target) naming at least one
# file, since an empty expansion would leave cargo to pick the targets.
declare -A CARGO_ARGS
for tier in "${tiers[@]}"; do
  if [ -z "${ARGS[$tier]+x}" ]; then
    echo "unknown tier: $tier (tiers: ${!ARGS[*]})" >&2; exit 2
  fi
  args=()
  for a in ${ARGS[$tier]}; do
    if [[ $a == @* ]]; then
      mapfile -t t < <(targets "${a#@}")
      if [ ${#t[@]} -eq 0 ]; then
        echo "tier $tier: $a matches no tests/tests/${a#@}_*.rs" >&2; exit 2
      fi
      args+=("${t[@]}")
    else
      args+=("$a")
    fi
  done
  CARGO_ARGS[$tier]="${args[*]}"
  rm -f "$LOG_DIR/$tier.skipped"
done

# Outside root the tiers that need it would only skip: say so and stop.
if [ "$(id -u)" != 0 ]; then
  need_root=()
  for tier in "${tiers[@]}"; do
    [[ $NO_ROOT_TIERS == *" $tier "* ]] || need_root+=("$tier")
  done
  if [ ${#need_root[@]} -gt 0 ] && [ "${CARINA_TEST_ALLOW_SKIP:-}" != 1 ]; then
    echo "hack/test.sh: the tiers ${need_root[*]} need root (loop devices, LVM, mounts," \
      "clusters) and this is uid $(id -u), where their tests would only skip." \
      "Run as root, run only the tiers that need none ($(echo $NO_ROOT_TIERS)), or set" \
      "CARINA_TEST_ALLOW_SKIP=1 to run them anyway with every skip counted as skipped." >&2
    exit 2
  fi
fi

for tier in "${tiers[@]}"; do
  # Everything the tier runs is built here, so it passes on a machine
  # where no earlier tier ran (the upstream tools are cached by version).
  if [ "${BINS[$tier]}" = yes ]; then
    cargo build --workspace --bins || { tier_error "$tier"; continue; }
  fi
  if [ "${TOOLS[$tier]}" != - ]; then
    IFS=, read -r -a tools <<<"${TOOLS[$tier]}"
    tests/tools/build.sh "${tools[@]}" || { tier_error "$tier"; continue; }
  fi
  read -r -a args <<<"${CARGO_ARGS[$tier]}"
  CARINA_TEST_LOG_DIR="$(cd "$LOG_DIR" && pwd)" run_tier "$tier" cargo test "${args[@]}"
  if [ "$tier" = sanity ]; then
    grep -o 'csi-sanity [a-z-]*: ran.*' "$LOG_DIR/sanity.log" || true
  fi
  if [ "$tier" = vm ]; then
    grep -o 'vm: csi-sanity [a-z-]*: ran.*' "$LOG_DIR/vm.log" || true
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
printf '%-10s %8s %8s %8s %8s\n' tier passed failed skipped ignored
for tier in "${tiers[@]}"; do
  [ -n "${PASSED[$tier]+x}" ] || continue
  printf '%-10s %8s %8s %8s %8s\n' "$tier" "${PASSED[$tier]}" "${FAILED[$tier]}" "${SKIPPED[$tier]}" "${IGNORED[$tier]}"
done
for tier in "${tiers[@]}"; do
  skipped_tests "$LOG_DIR/$tier.skipped" | awk -F'\t' -v t="$tier" '{ printf "skipped in %s: %s %s (%s)\n", t, $1, $2, $3 }'
done
echo "log scan: $scan"
echo "$total_passed passed, $total_failed failed, $total_skipped skipped, $total_ignored ignored"
exit $overall
