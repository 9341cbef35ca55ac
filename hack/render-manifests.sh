#!/usr/bin/env bash
# Renders the plain manifests in deploy/ from the Helm chart, which is their
# one source: `helm template` with the chart's default values, release
# namespace kube-system.
#
#   hack/render-manifests.sh           write deploy/kubernetes/*.yaml and
#                                      deploy/scheduler/deployment.yaml, and
#                                      copy deploy/crds/ into the chart
#   hack/render-manifests.sh --check   change nothing; exit 1 and show the
#                                      difference if a checked-in file is not
#                                      what a fresh render gives
#
# deploy/kubernetes/<template>.yaml is one file per chart template (the CRD
# template is left out: deploy/crds/ holds the CRDs);
# deploy/scheduler/deployment.yaml is templates/scheduler.yaml rendered with
# scheduler.enabled=true. helm comes from tests/tools/build.sh (built on first
# use) unless HELM names one.
set -euo pipefail
cd "$(dirname "$0")/.."

CHART=deploy/helm/carina
NAMESPACE=kube-system
CRDS=deploy/crds/carina.storage.io_crds.yaml
CHART_CRDS=$CHART/files/crds.yaml

die() { echo "render-manifests: $*" >&2; exit 1; }

check=false
case ${1:-} in
--check) check=true ;;
"") ;;
*) die "unknown argument '$1' (usage: hack/render-manifests.sh [--check])" ;;
esac

if [ -z "${HELM:-}" ]; then
  tests/tools/build.sh helm >&2
  HELM=$(tests/tools/build.sh --print-path helm)/helm
fi
[ -x "$HELM" ] || die "no helm at $HELM"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# helm keeps no state from here.
export HELM_CONFIG_HOME=$WORK/helm/config HELM_CACHE_HOME=$WORK/helm/cache HELM_DATA_HOME=$WORK/helm/data

# The chart's appVersion is the images' tag: the workspace version.
version=$(awk -F'"' '/^\[workspace.package\]/ {p=1} p && /^version/ {print $2; exit}' Cargo.toml)
app_version=$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' "$CHART/Chart.yaml")
[ "$version" = "$app_version" ] ||
  die "$CHART/Chart.yaml: appVersion is '$app_version', the workspace version is '$version'"

header() {
  printf '# Generated from %s by hack/render-manifests.sh\n' "$CHART"
  printf '# (default values%s, namespace %s).\n' "$1" "$NAMESPACE"
  printf '# Edit the chart and rerun the script: a test fails when this file\n'
  printf '# differs from a fresh render.\n'
}

# render OUT_DIR: the chart into OUT_DIR/kubernetes and
# OUT_DIR/scheduler/deployment.yaml.
render() {
  local out=$1 f
  "$HELM" template carina "$CHART" --namespace "$NAMESPACE" --output-dir "$WORK/render" >/dev/null
  mkdir -p "$out/kubernetes" "$out/scheduler"
  for f in "$WORK"/render/carina/templates/*.yaml; do
    [ "$(basename "$f")" = crds.yaml ] && continue
    { header ""; cat "$f"; } >"$out/kubernetes/$(basename "$f")"
  done
  rm -rf "$WORK/render"
  { header ", scheduler.enabled=true"
    "$HELM" template carina "$CHART" --namespace "$NAMESPACE" --set scheduler.enabled=true \
      --show-only templates/scheduler.yaml
  } >"$out/scheduler/deployment.yaml"
}

if $check; then
  render "$WORK/fresh"
  status=0
  diff -ru deploy/kubernetes "$WORK/fresh/kubernetes" || status=1
  diff -u deploy/scheduler/deployment.yaml "$WORK/fresh/scheduler/deployment.yaml" || status=1
  diff -u "$CRDS" "$CHART_CRDS" || status=1
  if [ $status -ne 0 ]; then
    echo "render-manifests: deploy/ differs from the chart; run hack/render-manifests.sh (make manifests)" >&2
    exit 1
  fi
  echo "render-manifests: deploy/ matches the chart"
else
  cp "$CRDS" "$CHART_CRDS"
  render "$WORK/fresh"
  rm -f deploy/kubernetes/*.yaml
  cp "$WORK"/fresh/kubernetes/*.yaml deploy/kubernetes/
  cp "$WORK/fresh/scheduler/deployment.yaml" deploy/scheduler/deployment.yaml
  echo "render-manifests: wrote deploy/kubernetes/ and deploy/scheduler/deployment.yaml"
fi
