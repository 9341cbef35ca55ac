#!/usr/bin/env bash
# Runs the whole suite as a first run on a fresh machine does: with an empty
# upstream-tool cache (Go modules and builds included) and an empty Cargo
# target directory, both in a temporary folder that is removed afterwards
# (CARINA_KEEP_COLD=1 keeps it). Prints how long it took. Source archives of
# upstream programs the Go module proxy does not serve stay where they are
# (CARINA_UPSTREAM_SRC, see tests/tools/README.md): they are inputs, not a cache.
# Usage: hack/test-cold.sh [tier...]      (make test-cold)
set -uo pipefail
cd "$(dirname "$0")/.."

parent=${CARINA_COLD_DIR:-/var/tmp}
cold=$(mktemp -d "$parent/carina-cold.XXXXXX")
cleanup() {
  if [ "${CARINA_KEEP_COLD:-0}" = 1 ]; then
    echo "test-cold: kept $cold"
  else
    # Go marks its module cache read-only.
    chmod -R u+w "$cold" 2>/dev/null
    rm -rf "$cold"
  fi
}
trap cleanup EXIT

echo "test-cold: empty caches in $cold"
start=$(date +%s)
CARINA_TOOLS_CACHE="$cold/tools" CARGO_TARGET_DIR="$cold/target" CARGO_INCREMENTAL=0 \
  CARINA_TEST_LOG_DIR="${CARINA_TEST_LOG_DIR:-target/test-logs}/cold" \
  hack/test.sh "$@"
rc=$?
elapsed=$(( $(date +%s) - start ))
printf 'test-cold: %s in %dm%02ds with empty caches\n' \
  "$([ $rc -eq 0 ] && echo passed || echo FAILED)" $((elapsed / 60)) $((elapsed % 60))
exit $rc
