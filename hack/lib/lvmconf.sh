# shellcheck shell=bash
# The node's lvm.conf settings, in one place: hack/images.sh and
# deploy/images/Containerfile apply them to the node image and
# tests/vm/build-guest.sh to the vm tier's guest, so the
# guest runs LVM as the image ships it.
#
# LVM in a container: no udev (the host's udev owns /dev), no dmeventd, and
# the lock files under /run/lock/lvm, which the DaemonSet mounts from the
# host so the host's own lvm commands and ours exclude each other.

# The settings as `section/key=value`, as `lvmconfig` prints them.
LVM_NODE_SETTINGS=(activation/udev_sync=0 activation/udev_rules=0 devices/obtain_device_list_from_udev=0
  activation/monitoring=0 'global/locking_dir="/run/lock/lvm"')

# lvm_conf_for_node FILE: rewrites Debian's lvm.conf FILE with those settings.
lvm_conf_for_node() {
  sed -i -E \
    -e 's/^(\s*)#?\s*udev_sync = [01]$/\1udev_sync = 0/' \
    -e 's/^(\s*)#?\s*udev_rules = [01]$/\1udev_rules = 0/' \
    -e 's/^(\s*)#?\s*obtain_device_list_from_udev = [01]$/\1obtain_device_list_from_udev = 0/' \
    -e 's/^(\s*)#?\s*monitoring = [01]$/\1monitoring = 0/' \
    -e 's|^(\s*)#?\s*locking_dir = ".*"$|\1locking_dir = "/run/lock/lvm"|' \
    "$1"
}
