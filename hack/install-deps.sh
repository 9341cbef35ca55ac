#!/usr/bin/env bash
# Installs what the build, the demo and the tests need, only when missing.
# Idempotent: a second run installs nothing. Debian/Ubuntu, as root.
set -euo pipefail

# command -> Debian package that provides it
declare -A NEED=(
  [lvm]=lvm2
  [sgdisk]=gdisk
  [sfdisk]=fdisk
  [parted]=parted
  [mkfs.xfs]=xfsprogs
  [xfs_quota]=xfsprogs
  [mkfs.ext4]=e2fsprogs
  [resize2fs]=e2fsprogs
  [chattr]=e2fsprogs
  [losetup]=mount
  [lsblk]=util-linux
  [blkid]=util-linux
  [wipefs]=util-linux
  [partx]=util-linux
  [findmnt]=util-linux
  [make-bcache]=bcache-tools
  [setquota]=quota
  [openssl]=openssl
  [curl]=curl
  [mmdebstrap]=mmdebstrap
  [skopeo]=skopeo
  [runc]=runc
  [gcc]=gcc          # the test images' pause program (static)
  # the vm tier: qemu under TCG; the guest's vmlinux is unpacked with xz
  # and the test executable it runs is copied without debug info (strip)
  [qemu-system-x86_64]=qemu-system-x86
  [xz]=xz-utils
  [strip]=binutils
  [dpkg-deb]=dpkg
)

missing=()
for cmd in "${!NEED[@]}"; do
  if ! command -v "$cmd" >/dev/null 2>&1 && ! [ -x "/usr/sbin/$cmd" ] && ! [ -x "/sbin/$cmd" ]; then
    missing+=("${NEED[$cmd]}")
  fi
done

# Packages without a command of their own: the static C library for pause.
if ! dpkg-query -W -f='${Status}' libc6-dev 2>/dev/null | grep -q 'ok installed'; then
  missing+=(libc6-dev)
fi

if [ "${#missing[@]}" -gt 0 ]; then
  mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "install-deps: installing ${pkgs[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: need root to install packages" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
else
  echo "install-deps: system packages present"
fi


if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: the Rust toolchain (cargo) is required" >&2
  exit 1
fi
