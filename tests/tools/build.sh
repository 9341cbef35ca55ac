#!/usr/bin/env bash
# Build the upstream programs carina's tests run against (csi-sanity, etcd,
# the Kubernetes control plane and node, the CSI sidecars, jaeger, promtool,
# containerd, helm, the e2e suite) from source, the container images a test node runs,
# and the vm tier's guest (a Debian kernel and an initramfs), into a versioned
# cache outside the clone.  See tests/tools/README.md.
#
#   tests/tools/build.sh [TOOL...]             build (default: all), reuse cache
#   tests/tools/build.sh --print-path TOOL...  print each tool's bin dir (image
#                                              tools: the archives' dir), no build
#
# TOOL: csi-sanity | etcd | kube | kubelet | csi-provisioner | csi-resizer |
#       csi-snapshotter | jaeger | promtool | containerd | crictl | cni | helm |
#       e2e | test-images | e2e-images | kernel | all
#       go-carina | go-carina-scheduler (not in all: built only when named)
set -euo pipefail

# ---- pinned versions ---------------------------------------------------------
CSI_SANITY_VERSION=v5.6.0       # github.com/kubernetes-csi/csi-test/v5
ETCD_VERSION=v3.6.16            # go.etcd.io/etcd/server/v3
KUBE_VERSION=v1.36.3            # k8s.io/kubernetes (staging modules v0.36.3)
CSI_PROVISIONER_VERSION=v6.3.0  # github.com/kubernetes-csi/external-provisioner/v6
CSI_SNAPSHOTTER_VERSION=v8.7.0  # github.com/kubernetes-csi/external-snapshotter/v8 (and client/v8)
JAEGER_VERSION=v1.75.0          # github.com/jaegertracing/jaeger (cmd/jaeger)
PROMTOOL_VERSION=v0.316.0       # github.com/prometheus/prometheus (cmd/promtool; Prometheus 3.16)
CONTAINERD_VERSION=v2.4.2       # github.com/containerd/containerd/v2
CRICTL_VERSION=v1.37.0          # sigs.k8s.io/cri-tools
CNI_PLUGINS_VERSION=v1.10.0     # github.com/containernetworking/plugins
HELM_VERSION=v3.21.4            # helm.sh/helm/v3 (cmd/helm)
CSI_RESIZER_VERSION=v2.2.1      # github.com/kubernetes-csi/external-resizer (source archive)
GO_CARINA_VERSION=v0.14.0       # github.com/carina-io/carina (source archive), the migration tests' predecessor
GO_CARINA_COMMIT=aec3a9f        # the commit of that tag, which its binaries log at start
# Go Carina's CRDs (its chart's crds/), kept beside its binaries.
GO_CARINA_CRDS=(crd-logicvolume.yaml crd-nodestoreresource.yaml)
# containerd v2.4's default sandbox image, which test-images provides.
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
# The image tools' recipes (below); bump when one changes.  Their cache
# directories also change with every input version and library they use.
IMAGES_REVISION=r3

TOOLS=(csi-sanity etcd kube kubelet csi-provisioner csi-resizer csi-snapshotter jaeger promtool containerd crictl
    cni helm e2e test-images e2e-images kernel)
# Tools built only when named (not part of `all`): test dependencies of one tier.
EXTRA_TOOLS=(go-carina go-carina-scheduler)
ROOT=${CARINA_TOOLS_CACHE:-/var/cache/carina-tools}
# Source archives of programs the Go module proxy does not serve.
SRC_ROOT=${CARINA_UPSTREAM_SRC:-/var/cache/carina-src}
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

usage() { sed -n '2,16s/^# \{0,1\}//p' "$0"; }
die() { echo "build.sh: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

tool_version() {
    case $1 in
    csi-sanity) echo "$CSI_SANITY_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    kube | kubelet | e2e) echo "$KUBE_VERSION" ;;
    csi-provisioner) echo "$CSI_PROVISIONER_VERSION" ;;
    csi-resizer) echo "$CSI_RESIZER_VERSION" ;;
    csi-snapshotter) echo "$CSI_SNAPSHOTTER_VERSION" ;;
    test-images | e2e-images) images_version "$1" ;;
    kernel) kernel_version ;;
    jaeger) echo "$JAEGER_VERSION" ;;
    promtool) echo "$PROMTOOL_VERSION" ;;
    containerd) echo "$CONTAINERD_VERSION" ;;
    crictl) echo "$CRICTL_VERSION" ;;
    cni) echo "$CNI_PLUGINS_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    go-carina | go-carina-scheduler) echo "$GO_CARINA_VERSION" ;;
    *) die "unknown tool '$1' (want one of: ${TOOLS[*]} ${EXTRA_TOOLS[*]} all)" ;;
    esac
}

tool_binaries() {
    case $1 in
    kube) echo kube-apiserver kube-controller-manager kube-scheduler ;;
    kubelet) echo kubelet kubectl kube-proxy ;;
    containerd) echo containerd containerd-shim-runc-v2 ctr ;;
    cni) echo bridge host-local loopback ;;
    e2e) echo e2e.test agnhost ;;
    csi-snapshotter) echo csi-snapshotter snapshot-controller ;;
    go-carina) echo carina-node carina-controller udevadm ;;
    go-carina-scheduler) echo carina-scheduler ;;
    test-images | e2e-images | kernel) ;;
    *) echo "$1" ;;
    esac
}

# Image tools: OCI archives <name>.oci.tar and images.tsv in the tool's dir.
tool_images() {
    case $1 in
    test-images) echo pause busybox csi-provisioner csi-resizer csi-snapshotter kube-scheduler ;;
    e2e-images) echo agnhost nginx glibc-dns-testing ;;
    esac
}

# Tools a tool is built from; built first when missing.
tool_deps() {
    case $1 in
    test-images) echo csi-provisioner csi-resizer csi-snapshotter kube ;;
    e2e-images) echo e2e ;;
    esac
}

# Other files a tool puts in its dir, beside bin/.
tool_files() {
    case $1 in
    csi-snapshotter) printf 'crds/%s\n' "${SNAPSHOT_CRDS[@]}" ;;
    go-carina) printf 'crds/%s\n' "${GO_CARINA_CRDS[@]}"; echo libexec/udevadm ;;
    kernel) printf '%s\n' vmlinux initrd.cpio modules.txt ;;
    esac
}

# Files (relative to the tool's dir) a complete build has.
tool_outputs() {
    local b
    for b in $(tool_binaries "$1"); do echo "bin/$b"; done
    tool_files "$1"
    if [[ -n $(tool_images "$1") ]]; then
        echo images.tsv
        for b in $(tool_images "$1"); do echo "$b.oci.tar"; done
    fi
}

tool_dir() { echo "$ROOT/$1-$(tool_version "$1")"; }
bin_dir() { echo "$(tool_dir "$1")/bin"; }

# Tools without programs of their own: the image tools and the kernel.
no_bin_dir() { [[ -n $(tool_images "$1") || $1 == kernel ]]; }

# What --print-path shows: the binaries' dir, or the dir of a tool without.
print_dir() {
    if no_bin_dir "$1"; then tool_dir "$1"; else bin_dir "$1"; fi
}

# images_version TOOL: IMAGES_REVISION and a digest of everything else the
# images are made of (versions, the Debian suite, the shared libraries and
# the pause source), so a change of any of them builds into a new dir.
images_version() {
    local suite digest
    # shellcheck disable=SC1091
    suite=${DEBIAN_SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
    digest=$(
        {
            echo "$1 $KUBE_VERSION $suite"
            [[ $1 != test-images ]] || echo "$PAUSE_IMAGE $CSI_PROVISIONER_VERSION $CSI_RESIZER_VERSION $CSI_SNAPSHOTTER_VERSION"
            cat "$REPO_DIR/hack/lib/oci.sh" "$REPO_DIR/hack/lib/rootfs.sh"
            [[ $1 != test-images ]] || cat "$REPO_DIR/tests/tools/pause.c"
        } | sha256sum | cut -c1-12
    )
    echo "$IMAGES_REVISION-$digest"
}

# ---- the vm tier's guest ---------------------------------------------------------

# The Debian packages the guest is made of; the kernel's name carries its
# ABI (linux-image-6.1.0-57-amd64), which changes with security updates.
kernel_package() {
    local pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
    [[ -n $pkg ]] || die "kernel: apt-cache knows no linux-image-amd64 (run apt-get update)"
    echo "$pkg"
}
KERNEL_PACKAGES=(busybox-static kmod libkmod2)
# The host packages whose programs the initramfs carries.
GUEST_HOST_PACKAGES=(libc6 lvm2 dmsetup bcache-tools e2fsprogs xfsprogs gdisk fdisk util-linux mount quota bash coreutils)

# kernel_version: the kernel's ABI and package version, and a digest of
# the recipe and of the host packages the initramfs copies programs from.
kernel_version() {
    local pkg ver digest
    pkg=$(kernel_package)
    ver=$(apt-cache show --no-all-versions "$pkg" | awk '$1 == "Version:" { print $2; exit }')
    digest=$(
        {
            echo "$pkg $ver"
            apt-cache show --no-all-versions "${KERNEL_PACKAGES[@]}" | grep '^Version:'
            dpkg-query -W "${GUEST_HOST_PACKAGES[@]}" 2>/dev/null
            cat "$REPO_DIR/tests/vm/build-guest.sh" "$REPO_DIR/tests/vm/init" "$REPO_DIR/hack/lib/lvmconf.sh"
        } | sha256sum | cut -c1-12
    )
    pkg=${pkg#linux-image-}
    echo "${pkg%-amd64}-$digest"
}

# The kernel and its modules are unpacked, never installed: installing
# would run the host's kernel hooks and write /boot and /lib/modules.
build_kernel() {
    local work=$1 out=$2 pkg d
    pkg=$(kernel_package)
    mkdir -p "$work/debs" "$work/kroot" "$work/kmod"
    (cd "$work/debs" && apt-get download -q "$pkg" "${KERNEL_PACKAGES[@]}" 2>&1 |
        grep -v '^W: Download is performed unsandboxed' >&2) || true
    for d in "$pkg" busybox-static; do
        compgen -G "$work/debs/${d}_*.deb" >/dev/null || die "kernel: apt-get download $d failed"
        dpkg-deb -x "$work/debs/${d}"_*.deb "$work/kroot"
    done
    for d in kmod libkmod2; do
        compgen -G "$work/debs/${d}_*.deb" >/dev/null || die "kernel: apt-get download $d failed"
        dpkg-deb -x "$work/debs/${d}"_*.deb "$work/kmod"
    done
    "$REPO_DIR/tests/vm/build-guest.sh" "$work/kroot" "$work/kmod" "$out"
}

# ---- go environment ------------------------------------------------------------
setup_go() {
    if ! command -v go >/dev/null; then
        # The official tarball's location, in case it is not on PATH.
        [[ -x /usr/local/go/bin/go ]] || die "go not found on PATH"
        PATH=$PATH:/usr/local/go/bin
    fi
    export GOMODCACHE=$ROOT/go/mod GOCACHE=$ROOT/go/build
    export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off
}

# ---- go.mod parsing (text of an upstream module's go.mod) --------------------------

# Path of the go.mod of MODULE@VERSION in the module cache (downloads it).
# Run it in a directory that is not (yet) a module.
upstream_gomod() {
    local gomod
    gomod=$(go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
    [[ -f $gomod ]] || die "could not download go.mod of $1@$2"
    echo "$gomod"
}

gomod_go_version() { awk '$1 == "go" { print $2; exit }' "$1"; }

# Lines "key=value" of the godebug directives (single-line or block form).
gomod_godebugs() {
    awk '{ sub(/\/\/.*/, "") }
         $1 == "godebug" && $2 == "(" { blk = 1; next }
         blk && $1 == ")" { blk = 0; next }
         blk && NF { print $1; next }
         $1 == "godebug" && NF > 1 { print $2 }' "$1"
}

# Lines "old[@v]=new[@v]" (the form `go mod edit -replace` takes) of the replace
# directives (single-line or block form).
gomod_replaces() {
    awk 'function emit(line,  side, o, t, n, m) {
             split(line, side, "=>"); n = split(side[1], o, " "); m = split(side[2], t, " ")
             if (n > 0 && m > 0) print o[1] (n > 1 ? "@" o[2] : "") "=" t[1] (m > 1 ? "@" t[2] : "")
         }
         { sub(/\/\/.*/, "") }
         $1 == "replace" && $2 == "(" { blk = 1; next }
         blk && $1 == ")" { blk = 0; next }
         blk { emit($0); next }
         $1 == "replace" { $1 = ""; emit($0) }' "$1"
}

# ---- wrapper module -----------------------------------------------------------------

# new_wrapper DIR MODULE VERSION [LOCAL_MAPPER]
# Creates in DIR a main module that requires MODULE@VERSION and carries over
# what `go install MODULE/...@VERSION` would lose: its go directive, godebug
# settings and replace directives.  Replaces that point at other modules are
# copied as they are.  Replaces that point at directories of the upstream repo
# (e.g. k8s staging, etcd's sibling modules) cannot work from the module cache:
# LOCAL_MAPPER, if given, is called as `LOCAL_MAPPER OLD_PATH DIR` and prints a
# module@version to use instead, or nothing to drop the replace; without a
# mapper they are dropped, so the versions upstream requires are used.
new_wrapper() {
    local dir=$1 mod=$2 ver=$3 mapper=${4:-} gomod r old new target kv
    mkdir -p "$dir"
    gomod=$(cd "$dir" && upstream_gomod "$mod" "$ver")
    printf 'module carina.local/tools/wrapper\n\ngo %s\n' "$(gomod_go_version "$gomod")" >"$dir/go.mod"
    (
        cd "$dir"
        go mod edit -require="$mod@$ver"
        while read -r kv; do
            go mod edit -godebug="$kv"
        done < <(gomod_godebugs "$gomod")
        while read -r r; do
            old=${r%%=*} new=${r#*=}
            case $new in
            ./* | ../* | /*)
                [[ -n $mapper ]] || continue
                target=$("$mapper" "${old%@*}" "$new")
                [[ -n $target ]] || continue
                ;;
            *) target=$new ;;
            esac
            go mod edit -replace="$old=$target"
        done < <(gomod_replaces "$gomod")
    )
}

# wrapper_build DIR GO_BUILD_ARGS...: `go build -trimpath ARGS` inside DIR.
wrapper_build() {
    local dir=$1
    shift
    (cd "$dir" && go build -trimpath "$@")
}

# ---- tools: build_<tool> WRAPPER_DIR OUT_BIN_DIR -------------------------------------

# kubernetes_csi_build WRAPPER_DIR OUT_BIN_DIR MODULE VERSION VAR NAME: the
# kubernetes-csi program MODULE/cmd/NAME, which reports VERSION from main.VAR.
kubernetes_csi_build() {
    local module=$3 v=$4 var=$5 name=$6
    new_wrapper "$1" "$module" "$v"
    wrapper_build "$1" -ldflags "-s -w -X main.$var=$v" -o "$2/$name" "$module/cmd/$name"
}

build_csi_sanity() {
    kubernetes_csi_build "$1" "$2" github.com/kubernetes-csi/csi-test/v5 \
        "$CSI_SANITY_VERSION" VERSION csi-sanity
}

build_etcd() {
    # The etcd binary is the main package at the root of the server module;
    # its go.mod replaces the sibling etcd modules by relative paths, dropped
    # here (server requires them at its own version anyway).
    new_wrapper "$1" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
    wrapper_build "$1" -ldflags "-s -w" -o "$2/etcd" go.etcd.io/etcd/server/v3
}

# k/k replaces each staging module k8s.io/X with ./staging/src/k8s.io/X; the
# same code is published as module k8s.io/X v0.<minor>.<patch>.
kube_staging() {
    [[ $2 == "./staging/src/$1" ]] || die "unexpected local replace in k8s.io/kubernetes: $1 => $2"
    echo "$1@${KUBE_VERSION/#v1./v0.}"
}

KUBE_TAGS=selinux,notest,grpcnotrace   # what hack/lib/golang.sh uses for release builds

# kube_ldflags: -ldflags stamping the version as hack/lib/version.sh does
# (minus git data).
kube_ldflags() {
    local v=$KUBE_VERSION minor major flags=() key val
    major=${v#v}; major=${major%%.*}
    minor=${v#v*.}; minor=${minor%%.*}
    for key in gitVersion=$v gitMajor=$major gitMinor=$minor gitTreeState=clean; do
        for val in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
            flags+=("-X $val.$key")
        done
    done
    echo "-s -w ${flags[*]}"
}

# kube_build WRAPPER_DIR OUT_BIN_DIR PACKAGE...: commands of k8s.io/kubernetes.
kube_build() {
    local dir=$1 out=$2
    shift 2
    new_wrapper "$dir" k8s.io/kubernetes "$KUBE_VERSION" kube_staging
    wrapper_build "$dir" -tags "$KUBE_TAGS" -ldflags "$(kube_ldflags)" -o "$out/" "$@"
}

build_kube() {
    kube_build "$1" "$2" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler
}

build_kubelet() {
    kube_build "$1" "$2" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl \
        k8s.io/kubernetes/cmd/kube-proxy
}

build_e2e() {
    # The e2e suite is a test binary (go test -c), built like k/k's
    # `make WHAT=test/e2e/e2e.test`; agnhost, the suite's many-purpose test
    # program, reports the version of its image (test/images/agnhost/VERSION).
    local dir=$1 out=$2 src
    new_wrapper "$dir" k8s.io/kubernetes "$KUBE_VERSION" kube_staging
    (cd "$dir" && go test -c -trimpath -tags "$KUBE_TAGS" -ldflags "$(kube_ldflags)" \
        -o "$out/e2e.test" k8s.io/kubernetes/test/e2e)
    src=$(cd "$dir" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    wrapper_build "$dir" -ldflags "-s -w -X main.Version=$(<"$src/test/images/agnhost/VERSION")" \
        -o "$out/agnhost" k8s.io/kubernetes/test/images/agnhost
}

build_csi_provisioner() {
    kubernetes_csi_build "$1" "$2" github.com/kubernetes-csi/external-provisioner/v6 \
        "$CSI_PROVISIONER_VERSION" version csi-provisioner
}

# The VolumeSnapshot CRDs (snapshot.storage.k8s.io/v1), from the snapshotter's
# client module (client/config/crd in its repository).
SNAPSHOT_CRDS=(snapshot.storage.k8s.io_volumesnapshotclasses.yaml
    snapshot.storage.k8s.io_volumesnapshotcontents.yaml snapshot.storage.k8s.io_volumesnapshots.yaml)

# external-snapshotter replaces its client module with ./client; the same
# code is published as github.com/kubernetes-csi/external-snapshotter/client/v8
# at the same version.
snapshotter_client() {
    [[ $1 == github.com/kubernetes-csi/external-snapshotter/client/v8 && $2 == ./client ]] ||
        die "unexpected local replace in external-snapshotter: $1 => $2"
    echo "$1@$CSI_SNAPSHOTTER_VERSION"
}

build_csi_snapshotter() {
    # The sidecar beside the controller, and the cluster-wide
    # snapshot-controller; both report main.version.  Their CRDs go to
    # crds/ of the tool's dir.
    local dir=$1 out=$2 v=$CSI_SNAPSHOTTER_VERSION m=github.com/kubernetes-csi/external-snapshotter/v8
    local client crd
    new_wrapper "$dir" "$m" "$v" snapshotter_client
    wrapper_build "$dir" -ldflags "-s -w -X main.version=$v" -o "$out/" \
        "$m/cmd/csi-snapshotter" "$m/cmd/snapshot-controller"
    client=$(cd "$dir" && go list -m -f '{{.Dir}}' github.com/kubernetes-csi/external-snapshotter/client/v8)
    [[ -d $client/config/crd ]] || die "no config/crd in $client"
    mkdir -p "$out/../crds"
    for crd in "${SNAPSHOT_CRDS[@]}"; do
        install -m 0644 "$client/config/crd/$crd" "$out/../crds/$crd"
    done
}

# source_archive NAME VERSION UPSTREAM: the path of NAME-VERSION.tar.xz in
# $SRC_ROOT, a release of UPSTREAM with its vendor/ folder, for programs the
# Go module proxy does not serve.  Dies saying how to make it when missing.
source_archive() {
    local name=$1 v=$2 upstream=$3 file
    file=$SRC_ROOT/$1-$2.tar.xz
    [[ -f $file ]] && { echo "$file"; return; }
    die "$(basename "$file") not found in $SRC_ROOT (CARINA_UPSTREAM_SRC).
  The Go module proxy does not serve $upstream, so it is built from a source
  archive with its dependencies vendored.  Make it where GitHub is reachable:
    git clone --depth 1 --branch $v https://$upstream $name-$v
    (cd $name-$v && go mod vendor && rm -rf .git)
    tar -cJf $name-$v.tar.xz $name-$v
  and copy $name-$v.tar.xz into $SRC_ROOT."
}

# vendored_build WORK_DIR ARCHIVE GO_BUILD_ARGS...: unpacks ARCHIVE (one
# top-level folder, a Go module with vendor/) into WORK_DIR and runs
# `go build -trimpath ARGS` there against its vendor/ folder, offline.
vendored_build() {
    local work=$1 archive=$2 src
    shift 2
    mkdir -p "$work"
    tar -xJf "$archive" -C "$work"
    src=$(find "$work" -mindepth 2 -maxdepth 2 -name go.mod -printf '%h\n')
    [[ $(wc -l <<<"$src") -eq 1 && -n $src ]] || die "$archive: expected one folder with a go.mod"
    [[ -f $src/vendor/modules.txt ]] || die "$archive has no vendor/ folder (run go mod vendor before packing it)"
    (cd "$src" && GOFLAGS=-mod=vendor GOPROXY=off go build -trimpath "$@")
}

build_csi_resizer() {
    local v=$CSI_RESIZER_VERSION archive
    archive=$(source_archive external-resizer "$v" github.com/kubernetes-csi/external-resizer)
    vendored_build "$1" "$archive" -ldflags "-s -w -X main.version=$v" \
        -o "$2/csi-resizer" ./cmd/csi-resizer
    (cd "$SRC_ROOT" && sha256sum "$(basename "$archive")") >"$2/../source.sha256"
}

# Go Carina, the project this one succeeds, for the migration tests: its
# node and controller, one module with vendor/, built offline as its
# Dockerfile builds them (without the debug flags, with the tag's commit).
# A test dependency only.
build_go_carina() {
    local v=$GO_CARINA_VERSION archive
    archive=$(source_archive carina "$v" github.com/carina-io/carina)
    vendored_build "$1" "$archive" -ldflags "-s -w -X main.gitCommitID=$GO_CARINA_COMMIT" \
        -o "$2/" ./cmd/carina-node ./cmd/carina-controller
    # Its node runs udev's udevadm to read a disk's properties (its image,
    # CentOS 7, has udev 219); this host may have none.  The one program,
    # taken from the udev package of the host's apt sources: nothing is
    # installed and no udev daemon runs (udevadm then reads sysfs).  Newer
    # udevadm prints record types udev 219 did not (M:, R:, U:, T:, D:, I:,
    # Q:), which Go's parser refuses; bin/udevadm prints only udev 219's.
    (cd "$1" && apt-get download udev) || die "apt-get download udev failed"
    mkdir -p "$1/udev" "$2/../libexec"
    dpkg-deb -x "$1"/udev_*.deb "$1/udev"
    install -m 0755 "$(find "$1/udev" -type f -path "*bin/udevadm" | head -n 1)" "$2/../libexec/udevadm"
    cat >"$2/udevadm" <<'SH'
#!/usr/bin/env bash
# udevadm as udev 219 prints `info`: its record types only.
set -o pipefail
real=$(dirname "$(readlink -f "$0")")/../libexec/udevadm
if [[ ${1:-} == info ]]; then
    "$real" "$@" | grep -E '^([PNSEL]: |$)'
else
    exec "$real" "$@"
fi
SH
    chmod 0755 "$2/udevadm"
    # Its chart's CRDs, which a Go install applies before anything else.
    mkdir -p "$2/../crds"
    for crd in "${GO_CARINA_CRDS[@]}"; do
        tar -xJOf "$archive" "carina-$v/charts/crds/$crd" >"$2/../crds/$crd"
    done
    (cd "$SRC_ROOT" && sha256sum "$(basename "$archive")") >"$2/../source.sha256"
}

# Go Carina's scheduler (kube-scheduler 1.26 with its capacity plugin), a
# module of its own in scheduler/ of the same archive.  That module has no
# vendor/ folder, so its modules come through the module proxy, checked
# against its go.sum; it is not built offline.
build_go_carina_scheduler() {
    local v=$GO_CARINA_VERSION archive src
    archive=$(source_archive carina "$v" github.com/carina-io/carina)
    mkdir -p "$1"
    tar -xJf "$archive" -C "$1"
    src=$(find "$1" -mindepth 2 -maxdepth 2 -name go.mod -printf '%h\n')/scheduler
    [[ -f $src/go.mod && -f $src/go.sum ]] || die "$archive: no scheduler/go.mod and go.sum"
    (cd "$src" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" -o "$2/carina-scheduler" ./cmd)
    (cd "$SRC_ROOT" && sha256sum "$(basename "$archive")") >"$2/../source.sha256"
}

build_jaeger() {
    # Without the (npm-built) UI assets: the binary serves a placeholder page.
    local v=$JAEGER_VERSION
    new_wrapper "$1" github.com/jaegertracing/jaeger "$v"
    wrapper_build "$1" -ldflags "-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion=$v" \
        -o "$2/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
}

build_promtool() {
    # Prometheus' module versions are v0.<300 + minor>.<patch> for release
    # v3.<minor>.<patch>; promtool reports the release version.
    local v=$PROMTOOL_VERSION m=github.com/prometheus/prometheus release
    release=${v#v0.}
    release=v3.$((10#${release%%.*} - 300)).${release#*.}
    new_wrapper "$1" "$m" "$v"
    wrapper_build "$1" -ldflags "-s -w -X github.com/prometheus/common/version.Version=${release#v}" \
        -o "$2/promtool" "$m/cmd/promtool"
}

build_containerd() {
    # The daemon, the runc shim and ctr, without the snapshotters that need
    # cgo or kernel modules this project does not use (overlayfs and native
    # stay).
    local v=$CONTAINERD_VERSION m=github.com/containerd/containerd/v2
    new_wrapper "$1" "$m" "$v"
    wrapper_build "$1" -tags no_btrfs,no_devmapper,no_zfs,no_aufs \
        -ldflags "-s -w -X $m/version.Version=$v" -o "$2/" \
        "$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr"
}

build_crictl() {
    local v=$CRICTL_VERSION m=sigs.k8s.io/cri-tools
    new_wrapper "$1" "$m" "$v"
    wrapper_build "$1" -ldflags "-s -w -X $m/pkg/version.Version=$v" -o "$2/crictl" "$m/cmd/crictl"
}

build_cni() {
    # What a one-node cluster needs: a bridge, addresses from a range, lo.
    local v=$CNI_PLUGINS_VERSION m=github.com/containernetworking/plugins
    new_wrapper "$1" "$m" "$v"
    wrapper_build "$1" -ldflags "-s -w" -o "$2/" \
        "$m/plugins/main/bridge" "$m/plugins/ipam/host-local" "$m/plugins/main/loopback"
}

build_helm() {
    # What helm's Makefile passes: the version, and the Kubernetes version
    # `helm template` and `helm lint` assume without a cluster (the
    # client-go it is built with, as k8s.io/client-go v0.X.Y is Kubernetes 1.X).
    local v=$HELM_VERSION kv major minor key flags=()
    new_wrapper "$1" helm.sh/helm/v3 "$v"
    kv=$(cd "$1" && go list -m -f '{{.Version}}' k8s.io/client-go)
    kv=${kv#v}
    major=$((${kv%%.*} + 1))
    minor=${kv#*.}; minor=${minor%%.*}
    flags+=("-X helm.sh/helm/v3/internal/version.version=$v")
    flags+=("-X helm.sh/helm/v3/internal/version.gitTreeState=clean")
    for key in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        flags+=("-X $key.k8sVersionMajor=$major" "-X $key.k8sVersionMinor=$minor")
    done
    wrapper_build "$1" -ldflags "-s -w ${flags[*]}" -o "$2/helm" helm.sh/helm/v3/cmd/helm
}

# ---- image tools: build_<tool> WORK_DIR OUT_DIR ---------------------------------------
# OCI archives made without a container engine (hack/lib/oci.sh), from the
# binaries above and Debian packages (hack/lib/rootfs.sh); OUT_DIR gets
# <name>.oci.tar for each image and images.tsv naming them.

# images_setup: what every image tool needs: root, mmdebstrap, the libraries,
# and one time stamp so the same inputs give the same digests.
images_setup() {
    [[ $(id -u) == 0 ]] || die "the image tools need root (mmdebstrap writes owners and device nodes)"
    command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (make deps installs it)"
    # shellcheck source=hack/lib/oci.sh
    . "$REPO_DIR/hack/lib/oci.sh"
    # shellcheck source=hack/lib/rootfs.sh
    . "$REPO_DIR/hack/lib/rootfs.sh"
    export SOURCE_DATE_EPOCH=0
}

# e2e_image_ref WORK_DIR ID: the reference the e2e suite of KUBE_VERSION
# uses for image ID (test/utils/image/manifest.go: `configs[ID] =
# Config{list.<Registry>, "<name>", "<tag>"}` and the default registries).
e2e_image_ref() {
    local work=$1 id=$2 src manifest ref
    mkdir -p "$work"
    src=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
    manifest=$src/test/utils/image/manifest.go
    [[ -f $manifest ]] || die "no $manifest"
    ref=$(awk -v id="$id" '
        /initRegistry = RegistryList\{/ { inreg = 1; next }
        inreg && /^[[:space:]]*\}/ { inreg = 0 }
        inreg && match($0, /^[[:space:]]*[A-Za-z0-9]+:[[:space:]]*"[^"]*"/) {
            split($0, kv, ":"); k = kv[1]; gsub(/[[:space:]]/, "", k)
            v = $0; sub(/^[^"]*"/, "", v); sub(/".*/, "", v); reg[k] = v
        }
        index($0, "configs[" id "] = Config{") {
            line = $0; sub(/.*Config\{/, "", line); sub(/\}.*/, "", line)
            n = split(line, f, ","); r = f[1]; gsub(/[[:space:]]|list\./, "", r)
            name = f[2]; tag = f[3]; gsub(/[[:space:]"]/, "", name); gsub(/[[:space:]"]/, "", tag)
        }
        END { if (r in reg && name != "" && tag != "") print reg[r] "/" name ":" tag }' "$manifest")
    [[ -n $ref ]] || die "$manifest: no reference for image $id"
    echo "$ref"
}

# busybox_root DIR [PACKAGE...]: Debian's static busybox with a link for each
# applet where busybox would install it, plus PACKAGEs, root and nobody.
busybox_root() {
    local dir=$1 applet
    shift
    rootfs_extract "$dir" "$(IFS=,; echo "busybox-static${*:+,$*}")"
    [[ -x $dir/bin/busybox ]] || die "busybox-static did not install /bin/busybox"
    for applet in $("$dir/bin/busybox" --list-full); do
        [[ -e $dir/$applet || -L $dir/$applet ]] && continue
        mkdir -p "$(dirname "$dir/$applet")"
        ln -s /bin/busybox "$dir/$applet"
    done
    rootfs_users "$dir"
    echo 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' >>"$dir/etc/passwd"
    echo 'nogroup:x:65534:' >>"$dir/etc/group"
    mkdir -p "$dir/root" "$dir/var/tmp" && chmod 1777 "$dir/var/tmp"
}

# static_root DIR BINARY [SUBDIR]: a root for one static program: BINARY at
# /SUBDIR (default: /), /etc/passwd, /tmp.
static_root() {
    local dir=$1/${3:-}
    mkdir -p "$1/tmp" "$dir" && chmod 1777 "$1/tmp"
    rootfs_users "$1"
    install -m 0755 "$2" "$dir/$(basename "$2")"
}

# add_image OUT NAME REF ROOT [OPTION...] [-- ENTRYPOINT...]: OUT/NAME.oci.tar
# from ROOT (oci_image's OPTIONs), listed in OUT/images.tsv.
add_image() {
    local out=$1 name=$2 ref=$3 root=$4 opts=()
    shift 4
    while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1"); shift; done
    [[ $# -eq 0 ]] || shift
    oci_image --label "org.opencontainers.image.title=$name" --created-by tests/tools/build.sh \
        "${opts[@]}" -- "$root" "$ref" "$out/$name.oci.tar" "$@"
    printf '%s.oci.tar\t%s\t%s\n' "$name" "$ref" "$OCI_MANIFEST_DIGEST" >>"$out/images.tsv"
}

build_test_images() {
    local work=$1 out=$2 ref
    images_setup
    mkdir -p "$work" "$out"
    printf '# file\treference\tmanifest digest\n' >"$out/images.tsv"

    # pause: the pod sandbox, a static C program (tests/tools/pause.c).
    command -v gcc >/dev/null || die "gcc is missing (make deps installs it)"
    mkdir -p "$work/pause"
    gcc -static -Os -s -Wall -Werror -o "$work/pause/pause" "$REPO_DIR/tests/tools/pause.c" ||
        die "could not build pause.c statically (needs gcc and libc6-dev: make deps)"
    add_image "$out" pause "$PAUSE_IMAGE" "$work/pause" --user 65535:65535 -- /pause

    # busybox: the e2e suite's default test image.
    ref=$(e2e_image_ref "$work/go" BusyBox)
    busybox_root "$work/busybox"
    add_image "$out" busybox "$ref" "$work/busybox" --cmd sh

    # The CSI sidecars, as the chart names them (static Go programs).
    local name v
    for name in csi-provisioner csi-resizer csi-snapshotter; do
        v=$(tool_version "$name")
        static_root "$work/$name" "$(bin_dir "$name")/$name"
        ref=registry.k8s.io/sig-storage/$name:$v
        add_image "$out" "$name" "$ref" "$work/$name" --label "org.opencontainers.image.version=$v" -- "/$name"
    done

    # kube-scheduler, for the chart's second scheduler (the extender's
    # partner): on PATH in /usr/local/bin as in the released image, whose
    # pods run it by name.
    static_root "$work/kube-scheduler" "$(bin_dir kube)/kube-scheduler" usr/local/bin
    add_image "$out" kube-scheduler "registry.k8s.io/kube-scheduler:$KUBE_VERSION" "$work/kube-scheduler" \
        --label "org.opencontainers.image.version=$KUBE_VERSION" -- /usr/local/bin/kube-scheduler
}

build_e2e_images() {
    local work=$1 out=$2 ref root
    images_setup
    mkdir -p "$work" "$out"
    printf '# file\treference\tmanifest digest\n' >"$out/images.tsv"

    # agnhost on a busybox root with bash (its tests run shell commands), the
    # user and group its image defines, and the layout of its Dockerfile.
    root=$work/agnhost
    busybox_root "$root" bash-static
    ln -sf bash-static "$root/bin/bash"
    install -m 0755 "$(bin_dir e2e)/agnhost" "$root/agnhost"
    ln -s agnhost "$root/agnhost-2"
    mkdir -p "$root/uploads"
    echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >>"$root/etc/passwd"
    printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >>"$root/etc/group"
    ref=$(e2e_image_ref "$work/go" Agnhost)
    add_image "$out" agnhost "$ref" "$root" --cmd pause -- /agnhost

    # nginx (the volumes suite runs a shell script in it): Debian's nginx on
    # a busybox root, serving its default page in the foreground.
    root=$work/nginx
    busybox_root "$root" nginx-light
    echo 'www-data:x:33:33:www-data:/var/www:/sbin/nologin' >>"$root/etc/passwd"
    echo 'www-data:x:33:' >>"$root/etc/group"
    mkdir -p "$root/var/log/nginx" "$root/var/lib/nginx" "$root/run"
    rootfs_check_links "$root"
    chroot "$root" /usr/sbin/nginx -t -q || die "nginx: its configuration does not load"
    ref=$(e2e_image_ref "$work/go" Nginx)
    add_image "$out" nginx "$ref" "$root" --cmd -g --cmd "daemon off;" -- /usr/sbin/nginx

    # glibc-dns-testing (the multivolume suite's pods): a glibc Debian root
    # with a shell, coreutils and the DNS tools its name is about.
    root=$work/glibc-dns-testing
    rootfs_extract "$root" dash,bash,coreutils,grep,sed,findutils,util-linux,mount,bind9-dnsutils,libc-bin
    ln -sf dash "$root/bin/sh"
    rootfs_users "$root"
    rootfs_check_links "$root"
    ref=$(e2e_image_ref "$work/go" GlibcDnsTesting)
    add_image "$out" glibc-dns-testing "$ref" "$root" --cmd /bin/sh
}

# ---- cache handling -----------------------------------------------------------------

CLEANUP=()
cleanup() { [[ ${#CLEANUP[@]} -eq 0 ]] || rm -rf "${CLEANUP[@]}"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A tool is built when its dir has every output it lists; a dir that lacks
# one (e.g. built before a binary was added to the tool) is rebuilt.
is_built() {
    local f dir
    dir=$(tool_dir "$1")
    for f in $(tool_outputs "$1"); do
        [[ -s $dir/$f ]] || return 1
        [[ $f != bin/* || -x $dir/$f ]] || return 1
    done
}

# Build TOOL (after the tools it is made from) into a temporary directory
# under $ROOT, then rename it into place, so $ROOT/<tool>-<version> is either
# complete or absent.
install_tool() {
    local tool=$1 ver dest tmp lock start f dep out
    ver=$(tool_version "$tool")
    dest=$ROOT/$tool-$ver
    if is_built "$tool"; then
        log "$tool $ver: cached in $dest"
        return
    fi
    for dep in $(tool_deps "$tool"); do install_tool "$dep"; done
    exec {lock}>"$ROOT/.$tool-$ver.lock"
    flock "$lock"   # another build.sh may be building the same tool
    if is_built "$tool"; then
        log "$tool $ver: cached in $dest"
        exec {lock}>&-
        return
    fi
    rm -rf "$ROOT/.build-$tool-$ver".*   # left by a killed build
    tmp=$(mktemp -d "$ROOT/.build-$tool-$ver.XXXXXX")
    CLEANUP+=("$tmp")
    mkdir -p "$tmp/out/bin"
    # Binary tools write into out/bin, image tools into out.
    out=$tmp/out/bin
    ! no_bin_dir "$tool" || { rmdir "$tmp/out/bin"; out=$tmp/out; }
    log "$tool $ver: building ..."
    start=$SECONDS
    "build_${tool//-/_}" "$tmp/wrapper" "$out"
    for f in $(tool_outputs "$tool"); do
        [[ -s $tmp/out/$f ]] || die "$tool: $f was not built"
    done
    # A record of what was built: the wrapper module, if there is one.
    if [[ -f $tmp/wrapper/go.mod ]]; then
        cp "$tmp/wrapper/go.mod" "$tmp/wrapper/go.sum" "$tmp/out/"
    fi
    rm -rf "$dest"   # an incomplete leftover, e.g. hand-made or missing a binary
    mv -T "$tmp/out" "$dest"
    # Unpacked sources may hold read-only folders.
    chmod -R u+w "$tmp" 2>/dev/null || true
    rm -rf "$tmp"
    exec {lock}>&-
    log "$tool $ver: built in $((SECONDS - start))s into $dest"
}

# ---- main ---------------------------------------------------------------------------

main() {
    local print=false tools=() t
    case ${1:-} in
    -h | --help) usage; return ;;
    --print-path) print=true; shift; [[ $# -gt 0 ]] || die "--print-path needs a TOOL" ;;
    -*) die "unknown option '$1'" ;;
    esac
    [[ $# -gt 0 ]] || set -- all
    for t in "$@"; do
        if [[ $t == all ]]; then
            tools+=("${TOOLS[@]}")
        else
            tool_version "$t" >/dev/null # dies on an unknown tool (EXTRA_TOOLS are known)
            tools+=("$t")
        fi
    done
    if $print; then
        for t in "${tools[@]}"; do print_dir "$t"; done
        return
    fi
    mkdir -p "$ROOT"
    setup_go
    for t in "${tools[@]}"; do install_tool "$t"; done
}

main "$@"
