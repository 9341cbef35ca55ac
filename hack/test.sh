#!/usr/bin/env bash
# Runs every test tier and prints how many tests ran in each.
# Usage: hack/test.sh [tier...]   tiers: unit engine grpc csi sanity kube (default: all, in that order)
set -uo pipefail
cd "$(dirname "$0")/.."

LOG_DIR=${CARINA_TEST_LOG_DIR:-target/test-logs}
mkdir -p "$LOG_DIR"

tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(unit engine grpc csi sanity kube)

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

for tier in "${tiers[@]}"; do
  case $tier in
    unit)
      run_tier unit cargo test --workspace --lib --bins ;;
    engine|grpc|csi)
      mapfile -t t < <(targets "$tier")
      if [ ${#t[@]} -eq 0 ]; then echo "=== tier: $tier: no test targets"; continue; fi
      run_tier "$tier" cargo test -p carina-tests "${t[@]}" ;;
    sanity)
      # csi-sanity against the real binaries: build them and the
      # upstream suite (cached after the first build) first.
      cargo build --workspace --bins || { tier_error sanity; continue; }
      tests/tools/build.sh csi-sanity || { tier_error sanity; continue; }
      CARINA_CSI_SANITY="$(tests/tools/build.sh --print-path csi-sanity)/csi-sanity" \
        CARINA_TEST_LOG_DIR="$(cd "$LOG_DIR" && pwd)" \
        run_tier sanity cargo test -p carina-tests --test sanity_csi -- --test-threads=1 --nocapture
      grep -o 'csi-sanity [a-z-]*: ran.*' "$LOG_DIR/sanity.log" || true ;;
    kube)
      # etcd + kube-apiserver (cached after the first build).
      tests/tools/build.sh etcd kube || { tier_error kube; continue; }
      mapfile -t t < <(targets kube)
      CARINA_TEST_LOG_DIR="$(cd "$LOG_DIR" && pwd)" \
        run_tier kube cargo test -p carina-tests "${t[@]}" ;;
    *)
      echo "unknown tier: $tier" >&2; exit 2 ;;
  esac
done

echo
echo "=== summary"
printf '%-10s %8s %8s %8s\n' tier passed failed ignored
for tier in "${tiers[@]}"; do
  [ -n "${PASSED[$tier]+x}" ] || continue
  printf '%-10s %8s %8s %8s\n' "$tier" "${PASSED[$tier]}" "${FAILED[$tier]}" "${IGNORED[$tier]}"
done
echo "$total_passed passed, $total_failed failed, $total_ignored skipped"
exit $overall
