#!/usr/bin/env bash
# Builds the OCI image archives of carina-node, carina-controller and
# carina-scheduler without a container engine: the release binaries, a root
# file system made by mmdebstrap from this machine's apt sources, and a
# deterministic tar per layer. The archives load with `ctr images import`,
# `skopeo copy oci-archive:...` and `podman load`.
#
# Usage: hack/images.sh [out-dir]          (default target/images)
# Environment:
#   IMAGE_REPO         repository prefix of the image names (default ghcr.io/carina-rs)
#   IMAGE_TAG          tag (default: the workspace version)
#   SOURCE_DATE_EPOCH  time stamp of every file and of the image (default: the last commit's)
#   APT_SOURCES        apt sources file for mmdebstrap (default: this machine's)
#   DEBIAN_SUITE       suite of the root file systems (default: this machine's)
#   IMAGE_BUILD_DIR    cargo target directory of the image binaries (default target/image-build)
#
# Reproducible: the same binaries, package versions and SOURCE_DATE_EPOCH give
# the same digests (every file gets the same time stamp and owner numbers,
# names are sorted, gzip stores no name or time). The binaries carry no debug
# information, no build id and no path of the checkout or the cargo home.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=$(realpath -m "${1:-target/images}")
REPO=${IMAGE_REPO:-ghcr.io/carina-rs}
VERSION=$(awk -F'"' '/^\[workspace.package\]/ {p=1} p && /^version/ {print $2; exit}' Cargo.toml)
TAG=${IMAGE_TAG:-$VERSION}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
SUITE=${DEBIAN_SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
if [ -z "${APT_SOURCES:-}" ]; then
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/ubuntu.sources /etc/apt/sources.list; do
    if [ -s "$f" ]; then APT_SOURCES=$f; break; fi
  done
fi
BUILD_DIR=$(realpath -m "${IMAGE_BUILD_DIR:-target/image-build}")

die() { echo "images: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap writes device nodes and owners)"
for tool in mmdebstrap tar gzip sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is missing (make deps installs it)"
done
[ -n "${APT_SOURCES:-}" ] || die "no apt sources found; set APT_SOURCES"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

# --- binaries -------------------------------------------------------------
# Stripped (no debug information, so no checkout path: cargo names the
# workspace's sources by relative paths), without a build id, and with the
# cargo home's path remapped, so the bytes do not depend on where things are.
# The flags do not name the checkout, so clones share one build cache.
echo "== binaries (release, $BUILD_DIR)"
CARGO_HOME_DIR=${CARGO_HOME:-$HOME/.cargo}
RUSTFLAGS="--remap-path-prefix=$CARGO_HOME_DIR=/cargo -C link-arg=-Wl,--build-id=none" \
CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=true CARGO_INCREMENTAL=0 \
CARGO_TARGET_DIR=$BUILD_DIR \
  cargo build --release --locked -q \
    -p carina-node --bin carina-node --bin carinactl \
    -p carina-controlplane --bin carina-controller \
    -p carina-scheduler --bin carina-scheduler
BIN=$BUILD_DIR/release

# --- root file systems ----------------------------------------------------
# Packages are extracted, not configured (no maintainer scripts run in an
# image), without recommends and without documentation.
debootstrap_root() {
  local dir=$1 include=$2
  mmdebstrap --quiet --variant=extract \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --include="$include" "$SUITE" "$dir" "$APT_SOURCES"
  # What the extraction leaves for a later apt run, and device nodes the
  # runtime provides.
  rm -rf "$dir"/dev/* "$dir"/etc/apt "$dir"/var/cache/apt "$dir"/var/lib/apt "$dir"/var/log/* \
    "$dir"/etc/resolv.conf "$dir"/etc/hostname "$dir"/etc/dpkg "$dir"/var/lib/dpkg \
    "$dir"/usr/share/lintian "$dir"/usr/share/bash-completion
  mkdir -p "$dir/tmp" && chmod 1777 "$dir/tmp"
}

# Every dynamically linked program under the root finds its libraries
# there: a pruned library still in use fails the build here, not at run time.
check_links() {
  local dir=$1 f out bad=0
  for f in "$dir"/bin/* "$dir"/sbin/* "$dir"/usr/bin/* "$dir"/usr/sbin/* "$dir"/usr/local/bin/*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    [ "$(head -c4 "$f" | tr -d '\0')" = $'\x7fELF' ] || continue
    out=$(chroot "$dir" /lib64/ld-linux-x86-64.so.2 --list "${f#"$dir"}" 2>&1) || true
    if grep -q "not found" <<<"$out"; then
      echo "images: ${f#"$dir"}: $(grep 'not found' <<<"$out" | head -3 | tr '\n' ' ')" >&2
      bad=1
    fi
  done
  [ "$bad" = 0 ] || die "a program in the image misses a library"
}

users() {
  local dir=$1
  mkdir -p "$dir/etc"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$dir/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$dir/etc/group"
}

echo "== node root file system ($SUITE)"
NODE_ROOT=$WORK/node
debootstrap_root "$NODE_ROOT" lvm2,xfsprogs,gdisk,parted,bcache-tools,e2fsprogs,util-linux,mount,fdisk,dash,coreutils
# xfsprogs pulls Python and ICU in for xfs_scrub_all only; the node runs
# mkfs.xfs, xfs_growfs and xfs_quota, which need neither.
rm -rf "$NODE_ROOT"/usr/lib/python3* "$NODE_ROOT"/usr/bin/python3* "$NODE_ROOT"/usr/share/python3 \
  "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/libpython3* "$NODE_ROOT"/usr/sbin/xfs_scrub* \
  "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/libicu* "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/gconv \
  "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/libsqlite3* "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/libdb-5.3* \
  "$NODE_ROOT"/usr/share/perl5 "$NODE_ROOT"/usr/share/initramfs-tools
ln -sf dash "$NODE_ROOT/bin/sh"
# LVM in a container: no udev (the host's udev owns /dev), no dmeventd, and
# the lock files under /run/lock/lvm, which the DaemonSet mounts from the
# host so the host's own lvm commands and ours exclude each other.
lvm_conf=$NODE_ROOT/etc/lvm/lvm.conf
[ -f "$lvm_conf" ] || die "lvm2 did not install $lvm_conf"
sed -i -E \
  -e 's/^(\s*)#?\s*udev_sync = [01]$/\1udev_sync = 0/' \
  -e 's/^(\s*)#?\s*udev_rules = [01]$/\1udev_rules = 0/' \
  -e 's/^(\s*)#?\s*obtain_device_list_from_udev = [01]$/\1obtain_device_list_from_udev = 0/' \
  -e 's/^(\s*)#?\s*monitoring = [01]$/\1monitoring = 0/' \
  -e 's|^(\s*)#?\s*locking_dir = ".*"$|\1locking_dir = "/run/lock/lvm"|' \
  "$lvm_conf"
for want in activation/udev_sync=0 activation/udev_rules=0 devices/obtain_device_list_from_udev=0 \
            activation/monitoring=0 global/locking_dir=\"/run/lock/lvm\"; do
  got=$(chroot "$NODE_ROOT" /sbin/lvm lvmconfig --type current "${want%%=*}" 2>/dev/null || true)
  [ "$got" = "${want#*/}" ] || die "lvm.conf: ${want%%=*} is '${got}', expected '${want#*/}'"
done
install -m 0755 "$BIN/carina-node" "$BIN/carinactl" -D -t "$NODE_ROOT/usr/local/bin"
users "$NODE_ROOT"
check_links "$NODE_ROOT"

echo "== minimal root file system ($SUITE)"
MIN_ROOT=$WORK/minimal
debootstrap_root "$MIN_ROOT" libc6,libgcc-s1
rm -rf "$MIN_ROOT"/usr/lib/x86_64-linux-gnu/gconv "$MIN_ROOT"/usr/share/gcc
users "$MIN_ROOT"
mkdir -p "$MIN_ROOT/home/nonroot"
chown 65532:65532 "$MIN_ROOT/home/nonroot"
CONTROLLER_ROOT=$WORK/controller SCHEDULER_ROOT=$WORK/scheduler
cp -a "$MIN_ROOT" "$CONTROLLER_ROOT"
cp -a "$MIN_ROOT" "$SCHEDULER_ROOT"
install -m 0755 "$BIN/carina-controller" -D -t "$CONTROLLER_ROOT/usr/local/bin"
install -m 0755 "$BIN/carina-scheduler" -D -t "$SCHEDULER_ROOT/usr/local/bin"
check_links "$CONTROLLER_ROOT"
check_links "$SCHEDULER_ROOT"

# --- OCI archives -----------------------------------------------------------
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# blob <file>: moves the file into the layout's blob store, prints its digest.
blob() {
  local file=$1 layout=$2 sum
  sum=$(sha256sum "$file" | cut -d' ' -f1)
  mkdir -p "$layout/blobs/sha256"
  mv "$file" "$layout/blobs/sha256/$sum"
  echo "$sum"
}

size_of() { stat -c %s "$1"; }

# json_array a b c -> ["a","b","c"]
json_array() {
  local first=1 item
  printf '['
  for item in "$@"; do
    [ $first = 1 ] || printf ','
    first=0
    printf '"%s"' "${item//\"/\\\"}"
  done
  printf ']'
}

# deterministic_tar <dir> <out>: sorted names, one time stamp, numeric
# owners, no access or change times.
deterministic_tar() {
  tar --sort=name --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime --numeric-owner \
    -C "$1" -cf "$2" .
}

# image <name> <root> <user> <entrypoint...>
image() {
  local name=$1 root=$2 user=$3; shift 3
  local layout=$WORK/oci-$name ref="$REPO/$name:$TAG"
  mkdir -p "$layout"
  deterministic_tar "$root" "$WORK/layer.tar"
  local diff_id layer layer_size
  diff_id=$(sha256sum "$WORK/layer.tar" | cut -d' ' -f1)
  gzip -n -9 "$WORK/layer.tar"
  layer_size=$(size_of "$WORK/layer.tar.gz")
  layer=$(blob "$WORK/layer.tar.gz" "$layout")

  printf '{"architecture":"amd64","os":"linux","created":"%s","config":{"User":"%s","Entrypoint":%s,"Env":["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"],"WorkingDir":"/","Labels":{"org.opencontainers.image.title":"%s","org.opencontainers.image.version":"%s"}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"hack/images.sh"}]}' \
    "$created" "$user" "$(json_array "$@")" "$name" "$TAG" "$diff_id" "$created" >"$WORK/config.json"
  local config config_size
  config_size=$(size_of "$WORK/config.json")
  config=$(blob "$WORK/config.json" "$layout")

  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$WORK/manifest.json"
  local manifest manifest_size
  manifest_size=$(size_of "$WORK/manifest.json")
  manifest=$(blob "$WORK/manifest.json" "$layout")

  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$ref" "$TAG" >"$layout/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  # The Docker archive index, for loaders that read only that form.
  printf '[{"Config":"blobs/sha256/%s","RepoTags":["%s"],"Layers":["blobs/sha256/%s"]}]' \
    "$config" "$ref" "$layer" >"$layout/manifest.json"
  deterministic_tar "$layout" "$OUT/$name.oci.tar"

  local uncompressed
  uncompressed=$(du -sb "$root" | cut -f1)
  printf '%s\t%s\tsha256:%s\t%s\t%s\n' "$name" "$ref" "$manifest" "$layer_size" "$uncompressed" >>"$WORK/summary.tsv"
}

echo "== archives ($OUT)"
: >"$WORK/summary.tsv"
image carina-node "$NODE_ROOT" 0 /usr/local/bin/carina-node
image carina-controller "$CONTROLLER_ROOT" 65532 /usr/local/bin/carina-controller
image carina-scheduler "$SCHEDULER_ROOT" 65532 /usr/local/bin/carina-scheduler
{
  printf '# image\treference\tmanifest digest\tcompressed bytes\tuncompressed bytes\n'
  cat "$WORK/summary.tsv"
} >"$OUT/images.tsv"
column -t -s $'\t' "$OUT/images.tsv"
