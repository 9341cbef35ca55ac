# shellcheck shell=bash
# OCI image archives without a container engine: one layer made from a
# directory, a config, a manifest and an index naming the image, written as
# a deterministic tar that `ctr images import`, `skopeo copy oci-archive:`
# and `podman load` read. Sourced by hack/images.sh and tests/tools/build.sh.
#
# Every time stamp is SOURCE_DATE_EPOCH (which the caller sets), names are
# sorted, owners are numeric and gzip stores no name or time, so the same
# inputs give the same bytes and digests.

# oci_deterministic_tar DIR OUT: DIR's contents as a tar with sorted names,
# one time stamp, numeric owners and no access or change times.
oci_deterministic_tar() {
  tar --sort=name --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --mtime="@${SOURCE_DATE_EPOCH:?SOURCE_DATE_EPOCH is not set}" --clamp-mtime --numeric-owner \
    -C "$1" -cf "$2" .
}

# oci_json_string S: S as a JSON string (quotes and backslashes escaped).
oci_json_string() {
  local s=${1//\\/\\\\}
  printf '"%s"' "${s//\"/\\\"}"
}

# oci_json_array A B ...: ["A","B",...]
oci_json_array() {
  local first=1 item
  printf '['
  for item in "$@"; do
    [ $first = 1 ] || printf ','
    first=0
    oci_json_string "$item"
  done
  printf ']'
}

# _oci_blob FILE LAYOUT: moves FILE into LAYOUT's blob store, prints its digest
# (hex).
_oci_blob() {
  local sum
  sum=$(sha256sum "$1" | cut -d' ' -f1)
  mkdir -p "$2/blobs/sha256"
  mv "$1" "$2/blobs/sha256/$sum"
  echo "$sum"
}

# oci_image [OPTION...] ROOT REF OUT [ENTRYPOINT...]
# Writes OUT, an OCI archive of one image: a single gzip layer holding the
# directory ROOT, named REF (the `io.containerd.image.name` annotation and
# the Docker-style manifest.json's RepoTags), for linux/amd64.
# Options:
#   --user U          the config's User (default 0)
#   --cmd ARG         one more element of the config's Cmd (repeatable)
#   --env K=V         one more element of Env (default only the usual PATH)
#   --label K=V       one more label (repeatable; in the order given)
#   --created-by S    the history entry's created_by (default hack/lib/oci.sh)
# Sets OCI_MANIFEST_DIGEST (sha256:...), OCI_LAYER_SIZE (bytes, compressed)
# and OCI_ROOT_SIZE (bytes, uncompressed).
oci_image() {
  local user=0 created_by=hack/lib/oci.sh cmd=() env=() labels=()
  while [ $# -gt 0 ]; do
    case $1 in
    --user) user=$2; shift 2 ;;
    --cmd) cmd+=("$2"); shift 2 ;;
    --env) env+=("$2"); shift 2 ;;
    --label) labels+=("$2"); shift 2 ;;
    --created-by) created_by=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "oci_image: unknown option $1" >&2; return 1 ;;
    *) break ;;
    esac
  done
  [ $# -ge 3 ] || { echo "oci_image: usage: oci_image [OPTION...] ROOT REF OUT [ENTRYPOINT...]" >&2; return 1; }
  local root=$1 ref=$2 out=$3
  shift 3
  [ ${#env[@]} -gt 0 ] || env=("PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin")
  local tag=${ref##*:}
  [[ $tag != */* && $tag != "$ref" ]] || tag=latest

  local work layout
  work=$(mktemp -d "${TMPDIR:-/tmp}/oci.XXXXXX")
  layout=$work/layout
  mkdir -p "$layout"

  local created
  created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

  oci_deterministic_tar "$root" "$work/layer.tar"
  local diff_id layer layer_size
  diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  gzip -n -9 "$work/layer.tar"
  layer_size=$(stat -c %s "$work/layer.tar.gz")
  layer=$(_oci_blob "$work/layer.tar.gz" "$layout")

  local label_json="" l first=1
  for l in "${labels[@]}"; do
    [ $first = 1 ] || label_json+=,
    first=0
    label_json+="$(oci_json_string "${l%%=*}"):$(oci_json_string "${l#*=}")"
  done
  local cmd_json=""
  [ ${#cmd[@]} -eq 0 ] || cmd_json=",\"Cmd\":$(oci_json_array "${cmd[@]}")"
  local entry_json=""
  [ $# -eq 0 ] || entry_json=",\"Entrypoint\":$(oci_json_array "$@")"

  printf '{"architecture":"amd64","os":"linux","created":"%s","config":{"User":%s%s%s,"Env":%s,"WorkingDir":"/","Labels":{%s}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":%s}]}' \
    "$created" "$(oci_json_string "$user")" "$entry_json" "$cmd_json" "$(oci_json_array "${env[@]}")" \
    "$label_json" "$diff_id" "$created" "$(oci_json_string "$created_by")" >"$work/config.json"
  local config config_size
  config_size=$(stat -c %s "$work/config.json")
  config=$(_oci_blob "$work/config.json" "$layout")

  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
  local manifest manifest_size
  manifest_size=$(stat -c %s "$work/manifest.json")
  manifest=$(_oci_blob "$work/manifest.json" "$layout")

  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":%s,"org.opencontainers.image.ref.name":%s}}]}' \
    "$manifest" "$manifest_size" "$(oci_json_string "$ref")" "$(oci_json_string "$tag")" >"$layout/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  # The Docker archive index, for loaders that read only that form.
  printf '[{"Config":"blobs/sha256/%s","RepoTags":[%s],"Layers":["blobs/sha256/%s"]}]' \
    "$config" "$(oci_json_string "$ref")" "$layer" >"$layout/manifest.json"
  oci_deterministic_tar "$layout" "$out"

  # shellcheck disable=SC2034 # results for the caller
  OCI_MANIFEST_DIGEST=sha256:$manifest
  # shellcheck disable=SC2034
  OCI_LAYER_SIZE=$layer_size
  # shellcheck disable=SC2034
  OCI_ROOT_SIZE=$(du -sb "$root" | cut -f1)
  rm -rf "$work"
}
