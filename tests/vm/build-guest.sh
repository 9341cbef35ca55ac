#!/usr/bin/env bash
# Builds the vm tier's guest from unpacked Debian packages: an uncompressed
# ELF vmlinux (booted through PVH, so the guest does not spend TCG time on
# decompression) and an uncompressed busybox initramfs carrying this
# machine's own storage tools with their libraries, the storage modules
# and the node image's lvm.conf settings. tests/tools/build.sh calls it.
#
#   build-guest.sh KROOT KMODROOT OUT_DIR
#     KROOT     the kernel and busybox-static packages, unpacked
#     KMODROOT  the kmod and libkmod2 packages, unpacked (modinfo, depmod)
#     OUT_DIR   receives vmlinux, initrd.cpio and modules.txt
set -euo pipefail
KROOT=$(readlink -f "$1") KMOD=$(readlink -f "$2") OUT=$3
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/lvmconf.sh
. "$HERE/../../hack/lib/lvmconf.sh"
die() { echo "build-guest: $*" >&2; exit 1; }

mapfile -t kvs < <(ls "$KROOT/lib/modules")
[[ ${#kvs[@]} -eq 1 ]] || die "expected one kernel in $KROOT/lib/modules, found: ${kvs[*]}"
KV=${kvs[0]}

# ---- vmlinux: the ELF inside the XZ-compressed bzImage ----------------------
vmlinuz=$KROOT/boot/vmlinuz-$KV
found=false
while read -r off; do
  # (xz stops at the stream's end, so tail's SIGPIPE is no failure)
  if xz -dc --single-stream <(tail -c +"$((off + 1))" "$vmlinuz") >"$OUT/vmlinux.tmp" 2>/dev/null &&
    [[ $(head -c 4 "$OUT/vmlinux.tmp" | od -An -tx1 | tr -d ' ') == 7f454c46 ]]; then
    found=true
    break
  fi
done < <(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$vmlinuz" | cut -d: -f1)
$found || die "no XZ-compressed ELF in $vmlinuz"
mv "$OUT/vmlinux.tmp" "$OUT/vmlinux"

# ---- the initramfs tree ------------------------------------------------------
S=$(mktemp -d "${TMPDIR:-/tmp}/carina-guest.XXXXXX")
KB=$(mktemp -d "${TMPDIR:-/tmp}/carina-kmod.XXXXXX")
trap 'rm -rf "$S" "$KB"' EXIT
export LD_LIBRARY_PATH=$KMOD/usr/lib/x86_64-linux-gnu
for t in modinfo depmod; do ln -s "$KMOD/bin/kmod" "$KB/$t"; done # kmod picks its job by argv[0]

mkdir -p "$S"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,bb,proc,sys,dev,run,tmp,mnt,etc/lvm,root,var/lib}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$S/$d"; done
# busybox applets in /bb, last on PATH: a real tool of the same name wins.
cp "$KROOT/bin/busybox" "$S/usr/bin/busybox"
for a in $("$S/usr/bin/busybox" --list); do ln -s /usr/bin/busybox "$S/bb/$a"; done
ln -s /usr/bin/busybox "$S/usr/bin/sh"

# copy_tool PATH: the program (its target if a link) at the same place in
# the guest, with every library ldd names, and the ELF interpreter.
copy_tool() {
  local src=$1 lib
  [[ -e $src ]] || die "$src is missing (hack/install-deps.sh installs it)"
  mkdir -p "$S$(dirname "$src")"
  cp -L "$src" "$S$src"
  while read -r lib; do
    [[ -e $S$lib ]] || { mkdir -p "$S$(dirname "$lib")"; cp -L "$lib" "$S$lib"; }
  done < <(ldd "$src" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
}
tool_path() { command -v "$1" || { [[ -x /usr/sbin/$1 ]] && echo "/usr/sbin/$1"; } || die "$1 is missing"; }
# What the node runs (nodesvc, sys), as the node image has it.
for t in lvm dmsetup make-bcache bcache-super-show mkfs.ext4 mke2fs resize2fs e2fsck tune2fs dumpe2fs \
  mkfs.xfs xfs_growfs xfs_db xfs_quota xfs_repair sgdisk sfdisk partx blkid wipefs lsblk findmnt \
  mount umount losetup blockdev chattr setquota stat readlink bash; do
  copy_tool "$(readlink -f "$(tool_path "$t")")"
  p=$(tool_path "$t")
  [[ -e $S$p ]] || ln -s "$(readlink -f "$p")" "$S$p"
done
# Libraries a program may load without ldd seeing it.
for lib in /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 /usr/lib/x86_64-linux-gnu/libnss_files.so.2; do
  [[ -e $lib ]] && cp -nL "$lib" "$S$lib"
done
# kmod from its package: the program and libkmod at the usual places.
cp "$KMOD/bin/kmod" "$S/usr/bin/kmod"
cp -L "$KMOD"/usr/lib/x86_64-linux-gnu/libkmod.so.2 "$S/usr/lib/x86_64-linux-gnu/"
while read -r lib; do
  [[ -e $S$lib ]] || cp -L "$lib" "$S$lib"
done < <(ldd "$KMOD/bin/kmod" | awk '$2 == "=>" && $3 ~ /^\/(usr\/)?lib/ { print $3 }')
for l in modprobe insmod rmmod lsmod depmod modinfo; do ln -s ../bin/kmod "$S/usr/sbin/$l"; done
for l in pvcreate pvremove pvs vgcreate vgchange vgremove vgs lvcreate lvchange lvextend lvremove lvs; do
  ln -sf lvm "$S/usr/sbin/$l"
done
cp /etc/mke2fs.conf "$S/etc/"
cp /etc/lvm/lvm.conf "$S/etc/lvm/lvm.conf"
lvm_conf_for_node "$S/etc/lvm/lvm.conf"
for want in "${LVM_NODE_SETTINGS[@]}"; do
  got=$(LVM_SYSTEM_DIR=$S/etc/lvm lvm lvmconfig --type current "${want%%=*}" 2>/dev/null || true)
  [[ $got == "${want#*/}" ]] || die "lvm.conf: ${want%%=*} is '$got', expected '${want#*/}'"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$S/etc/passwd"
printf 'root:x:0:\ndisk:x:6:\n' >"$S/etc/group"

# ---- modules: the wanted ones and everything they need -----------------------
[[ -f $KROOT/lib/modules/$KV/modules.dep ]] || "$KB/depmod" -b "$KROOT" "$KV" # the package ships none
modinfo_() { "$KB/modinfo" -b "$KROOT" -k "$KV" "$@"; }
want=(virtio_pci virtio_blk 9pnet_virtio 9p ext4 xfs crc32c_generic crc32c-intel libcrc32c
  dm-mod dm-snapshot dm-thin-pool bcache loop quota_v2)
declare -A seen=()
queue=("${want[@]}")
while ((${#queue[@]})); do
  m=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -z ${seen[$m]:-} ]] || continue
  seen[$m]=1
  files=$(modinfo_ -F filename "$m") || die "module $m is not in $KV"
  for f in $files; do
    [[ $f == "(builtin)" ]] && continue
    rel=${f#"$KROOT"}
    mkdir -p "$S$(dirname "$rel")"
    cp "$f" "$S$rel"
  done
  deps=$(modinfo_ -F depends "$m")
  [[ -z $deps ]] || queue+=(${deps//,/ })
  soft=$(modinfo_ -F softdep "$m" | tr ' ' '\n' | grep -v ':' || true)
  [[ -z $soft ]] || queue+=($soft)
done
cp "$KROOT/lib/modules/$KV"/modules.{order,builtin,builtin.modinfo} "$S/usr/lib/modules/$KV/"
"$KB/depmod" -b "$S" "$KV"
printf '%s\n' "${want[@]}" >"$S/etc/vm-modules"
cp "$S/etc/vm-modules" "$OUT/modules.txt"
install -m 0755 "$HERE/init" "$S/init"
mknod -m 600 "$S/dev/console" c 5 1
mknod -m 666 "$S/dev/null" c 1 3
# Uncompressed: the guest does not spend TCG time on gunzip.
(cd "$S" && find . | "$S/usr/bin/busybox" cpio -o -H newc -R 0:0 2>/dev/null) >"$OUT/initrd.cpio"
echo "build-guest: kernel $KV, initrd $(du -h "$OUT/initrd.cpio" | cut -f1), $(find "$S" -name '*.ko' | wc -l) modules" >&2
