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
#   IMAGES_REUSE_KEY   when set, archives that out-dir holds from a build with
#                      the same key and the same inputs (binaries, these
#                      scripts, the settings above) are kept, not rebuilt; the
#                      test runner passes one key per run, since the packages
#                      the apt sources serve may change between runs
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
BUILD_DIR=$(realpath -m "${IMAGE_BUILD_DIR:-target/image-build}")

die() { echo "images: $*" >&2; exit 1; }
# shellcheck source=hack/lib/oci.sh
. hack/lib/oci.sh
# shellcheck source=hack/lib/rootfs.sh
. hack/lib/rootfs.sh
# shellcheck source=hack/lib/lvmconf.sh
. hack/lib/lvmconf.sh
[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap writes device nodes and owners)"
for tool in mmdebstrap tar gzip sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is missing (make deps installs it)"
done
rootfs_apt_defaults || exit 1
SUITE=$ROOTFS_SUITE

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

# --- binaries -------------------------------------------------------------
# Stripped (no debug information, so no checkout path: cargo names the
# workspace's sources by relative paths), without a build id, and with the
# cargo home's path remapped, so the bytes do not depend on where things are.
# The flags do not name the checkout, so clones share one build cache. The
# build sees one fixed SOURCE_DATE_EPOCH, not the images' time stamp: build
# scripts that compile C (ring's) rerun when it changes, and with them
# everything above them, so builds with other time stamps (the tests') would
# each rebuild the whole release.
echo "== binaries (release, $BUILD_DIR)"
CARGO_HOME_DIR=${CARGO_HOME:-$HOME/.cargo}
# Cargo judges the workspace's own crates fresh by file times, so a shared
# build directory last used by another checkout with newer files would hand
# this one that checkout's binaries. The directory remembers the contents of
# the tree it last built; another tree cleans the workspace's crates first
# (their dependencies stay built).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  TREE=$(git ls-files -z -c -o --exclude-standard | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
else
  TREE=$(find . -path ./target -prune -o -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
fi
if [ "$(cat "$BUILD_DIR/source-tree.sha256" 2>/dev/null)" != "$TREE" ] && [ -d "$BUILD_DIR/release" ]; then
  echo "   another source tree was built here last: rebuilding the workspace's crates"
  members=$(cargo metadata --no-deps --format-version 1 --locked |
    grep -o '"name":"carina-[a-z-]*","version"' | cut -d'"' -f4 | sort -u)
  for member in $members; do
    CARGO_TARGET_DIR=$BUILD_DIR cargo clean --release --locked -q -p "$member"
  done
fi
rm -f "$BUILD_DIR/source-tree.sha256"
SOURCE_DATE_EPOCH=0 \
RUSTFLAGS="--remap-path-prefix=$CARGO_HOME_DIR=/cargo -C link-arg=-Wl,--build-id=none" \
CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=true CARGO_INCREMENTAL=0 \
CARGO_TARGET_DIR=$BUILD_DIR \
  cargo build --release --locked -q \
    -p carina-node --bin carina-node \
    -p carina-ctl --bin carinactl \
    -p carina-controlplane --bin carina-controller \
    -p carina-scheduler --bin carina-scheduler
BIN=$BUILD_DIR/release
echo "$TREE" >"$BUILD_DIR/source-tree.sha256"

# The inputs of the archives, when asked to keep a build of the same ones.
INPUTS=
if [ -n "${IMAGES_REUSE_KEY:-}" ]; then
  INPUTS=$({
    printf '%s\n' "$IMAGES_REUSE_KEY" "$REPO" "$TAG" "$SOURCE_DATE_EPOCH" "$SUITE" "$ROOTFS_APT_SOURCES"
    sha256sum "$BIN/carina-node" "$BIN/carinactl" "$BIN/carina-controller" "$BIN/carina-scheduler" \
      hack/images.sh hack/lib/oci.sh hack/lib/rootfs.sh hack/lib/lvmconf.sh "$ROOTFS_APT_SOURCES"
  } | sha256sum | cut -d' ' -f1)
  if [ -f "$OUT/inputs.sha256" ] && [ "$(cat "$OUT/inputs.sha256")" = "$INPUTS" ] &&
    [ -s "$OUT/images.tsv" ] && [ -s "$OUT/carina-node.oci.tar" ] &&
    [ -s "$OUT/carina-controller.oci.tar" ] && [ -s "$OUT/carina-scheduler.oci.tar" ]; then
    echo "== archives ($OUT): kept, built earlier from the same inputs"
    column -t -s $'\t' "$OUT/images.tsv"
    exit 0
  fi
fi
rm -f "$OUT/inputs.sha256"

# --- root file systems ----------------------------------------------------
# Packages are extracted, not configured (no maintainer scripts run in an
# image); hack/lib/rootfs.sh. Every dynamically linked program is checked to
# find its libraries in the root: a pruned library still in use fails the
# build here, not at run time.
echo "== node root file system ($SUITE)"
NODE_ROOT=$WORK/node
rootfs_extract "$NODE_ROOT" lvm2,xfsprogs,gdisk,parted,bcache-tools,e2fsprogs,util-linux,mount,fdisk,dash,coreutils
# xfsprogs pulls Python and ICU in for xfs_scrub_all only; the node runs
# mkfs.xfs, xfs_growfs and xfs_quota, which need neither.
rm -rf "$NODE_ROOT"/usr/lib/python3* "$NODE_ROOT"/usr/bin/python3* "$NODE_ROOT"/usr/share/python3 \
  "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/libpython3* "$NODE_ROOT"/usr/sbin/xfs_scrub* \
  "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/libicu* "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/gconv \
  "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/libsqlite3* "$NODE_ROOT"/usr/lib/x86_64-linux-gnu/libdb-5.3* \
  "$NODE_ROOT"/usr/share/perl5 "$NODE_ROOT"/usr/share/initramfs-tools
ln -sf dash "$NODE_ROOT/bin/sh"
# LVM as a container runs it (hack/lib/lvmconf.sh; the vm tier's guest
# uses the same settings).
lvm_conf=$NODE_ROOT/etc/lvm/lvm.conf
[ -f "$lvm_conf" ] || die "lvm2 did not install $lvm_conf"
lvm_conf_for_node "$lvm_conf"
for want in "${LVM_NODE_SETTINGS[@]}"; do
  got=$(chroot "$NODE_ROOT" /sbin/lvm lvmconfig --type current "${want%%=*}" 2>/dev/null || true)
  [ "$got" = "${want#*/}" ] || die "lvm.conf: ${want%%=*} is '${got}', expected '${want#*/}'"
done
install -m 0755 "$BIN/carina-node" "$BIN/carinactl" -D -t "$NODE_ROOT/usr/local/bin"
rootfs_users "$NODE_ROOT"
rootfs_check_links "$NODE_ROOT"

echo "== minimal root file system ($SUITE)"
MIN_ROOT=$WORK/minimal
rootfs_extract "$MIN_ROOT" libc6,libgcc-s1
rm -rf "$MIN_ROOT"/usr/lib/x86_64-linux-gnu/gconv "$MIN_ROOT"/usr/share/gcc
rootfs_users "$MIN_ROOT"
mkdir -p "$MIN_ROOT/home/nonroot"
chown 65532:65532 "$MIN_ROOT/home/nonroot"
CONTROLLER_ROOT=$WORK/controller SCHEDULER_ROOT=$WORK/scheduler
cp -a "$MIN_ROOT" "$CONTROLLER_ROOT"
cp -a "$MIN_ROOT" "$SCHEDULER_ROOT"
install -m 0755 "$BIN/carina-controller" -D -t "$CONTROLLER_ROOT/usr/local/bin"
install -m 0755 "$BIN/carina-scheduler" -D -t "$SCHEDULER_ROOT/usr/local/bin"
rootfs_check_links "$CONTROLLER_ROOT"
rootfs_check_links "$SCHEDULER_ROOT"

# --- OCI archives (hack/lib/oci.sh) -----------------------------------------

# image <name> <root> <user> <entrypoint...>
image() {
  local name=$1 root=$2 user=$3; shift 3
  local ref="$REPO/$name:$TAG"
  oci_image --user "$user" --label "org.opencontainers.image.title=$name" \
    --label "org.opencontainers.image.version=$TAG" --created-by hack/images.sh \
    "$root" "$ref" "$OUT/$name.oci.tar" "$@"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$ref" "$OCI_MANIFEST_DIGEST" "$OCI_LAYER_SIZE" "$OCI_ROOT_SIZE" >>"$WORK/summary.tsv"
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
[ -z "$INPUTS" ] || echo "$INPUTS" >"$OUT/inputs.sha256"
