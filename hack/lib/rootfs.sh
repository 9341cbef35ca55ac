# shellcheck shell=bash
# Root file systems for images, made from Debian packages with mmdebstrap
# (no container engine, no maintainer scripts). Sourced by hack/images.sh and
# tests/tools/build.sh; needs root.

# rootfs_apt_defaults: sets ROOTFS_SUITE (DEBIAN_SUITE, default this
# machine's release) and ROOTFS_APT_SOURCES (APT_SOURCES, default this
# machine's sources file); fails when there is none.
rootfs_apt_defaults() {
  local f
  # shellcheck disable=SC1091
  ROOTFS_SUITE=${DEBIAN_SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
  ROOTFS_APT_SOURCES=${APT_SOURCES:-}
  if [ -z "$ROOTFS_APT_SOURCES" ]; then
    for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/ubuntu.sources /etc/apt/sources.list; do
      if [ -s "$f" ]; then ROOTFS_APT_SOURCES=$f; break; fi
    done
  fi
  [ -n "$ROOTFS_APT_SOURCES" ] || { echo "rootfs: no apt sources found; set APT_SOURCES" >&2; return 1; }
}

# rootfs_extract DIR PACKAGES: the comma-separated PACKAGES and their
# dependencies, extracted (not configured) into DIR, without recommends and
# documentation, without what only apt and dpkg use later and without device
# nodes (the runtime provides /dev); DIR/tmp is world-writable.
rootfs_extract() {
  local dir=${1:?} include=$2
  rootfs_apt_defaults
  mmdebstrap --quiet --variant=extract \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --include="$include" "$ROOTFS_SUITE" "$dir" "$ROOTFS_APT_SOURCES"
  rm -rf "${dir:?}"/dev/* "$dir"/etc/apt "$dir"/var/cache/apt "$dir"/var/lib/apt "$dir"/var/log/* \
    "$dir"/etc/resolv.conf "$dir"/etc/hostname "$dir"/etc/dpkg "$dir"/var/lib/dpkg \
    "$dir"/usr/share/lintian "$dir"/usr/share/bash-completion
  mkdir -p "$dir/tmp" && chmod 1777 "$dir/tmp"
}

# rootfs_check_links DIR: every dynamically linked program under DIR's
# bin and sbin folders finds its libraries in DIR, so a missing library fails
# the build, not the container.
rootfs_check_links() {
  local dir=$1 f out bad=0
  for f in "$dir"/bin/* "$dir"/sbin/* "$dir"/usr/bin/* "$dir"/usr/sbin/* "$dir"/usr/local/bin/*; do
    if [ ! -f "$f" ] || [ -L "$f" ]; then continue; fi
    [ "$(head -c4 "$f" | tr -d '\0')" = $'\x7fELF' ] || continue
    out=$(chroot "$dir" /lib64/ld-linux-x86-64.so.2 --list "${f#"$dir"}" 2>&1) || true
    if grep -q "not found" <<<"$out"; then
      echo "rootfs: ${f#"$dir"}: $(grep 'not found' <<<"$out" | head -3 | tr '\n' ' ')" >&2
      bad=1
    fi
  done
  [ "$bad" = 0 ] || { echo "rootfs: a program in $dir misses a library" >&2; return 1; }
}

# rootfs_users DIR: /etc/passwd and /etc/group with root and nonroot (65532).
rootfs_users() {
  mkdir -p "$1/etc"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$1/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$1/etc/group"
}
