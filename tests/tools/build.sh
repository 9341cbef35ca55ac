#!/usr/bin/env bash
# Build the upstream Go programs carina's tests run against (csi-sanity, etcd,
# the Kubernetes control plane, external-provisioner, jaeger, containerd, helm)
# from the Go module proxy into a versioned cache outside the clone.  See
# tests/tools/README.md.
#
#   tests/tools/build.sh [TOOL...]             build (default: all), reuse cache
#   tests/tools/build.sh --print-path TOOL...  print each tool's bin dir, no build
#
# TOOL: csi-sanity | etcd | kube | kubelet | csi-provisioner | jaeger |
#       containerd | crictl | cni | helm | all
set -euo pipefail

# ---- pinned versions ---------------------------------------------------------
CSI_SANITY_VERSION=v5.6.0       # github.com/kubernetes-csi/csi-test/v5
ETCD_VERSION=v3.6.16            # go.etcd.io/etcd/server/v3
KUBE_VERSION=v1.36.3            # k8s.io/kubernetes (staging modules v0.36.3)
CSI_PROVISIONER_VERSION=v6.3.0  # github.com/kubernetes-csi/external-provisioner/v6
JAEGER_VERSION=v1.76.0          # github.com/jaegertracing/jaeger (cmd/jaeger)
CONTAINERD_VERSION=v2.4.2       # github.com/containerd/containerd/v2
CRICTL_VERSION=v1.37.0          # sigs.k8s.io/cri-tools
CNI_PLUGINS_VERSION=v1.10.0     # github.com/containernetworking/plugins
HELM_VERSION=v3.22.0            # helm.sh/helm/v3 (cmd/helm)

TOOLS=(csi-sanity etcd kube kubelet csi-provisioner jaeger containerd crictl cni helm)
ROOT=${CARINA_TOOLS_CACHE:-/var/cache/carina-tools}

usage() { sed -n '2,11s/^# \{0,1\}//p' "$0"; }
die() { echo "build.sh: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

tool_version() {
    case $1 in
    csi-sanity) echo "$CSI_SANITY_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    kube | kubelet) echo "$KUBE_VERSION" ;;
    csi-provisioner) echo "$CSI_PROVISIONER_VERSION" ;;
    jaeger) echo "$JAEGER_VERSION" ;;
    containerd) echo "$CONTAINERD_VERSION" ;;
    crictl) echo "$CRICTL_VERSION" ;;
    cni) echo "$CNI_PLUGINS_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    *) die "unknown tool '$1' (want one of: ${TOOLS[*]} all)" ;;
    esac
}

tool_binaries() {
    case $1 in
    kube) echo kube-apiserver kube-controller-manager kube-scheduler ;;
    kubelet) echo kubelet kubectl ;;
    containerd) echo containerd containerd-shim-runc-v2 ctr ;;
    cni) echo bridge host-local loopback ;;
    *) echo "$1" ;;
    esac
}

bin_dir() { echo "$ROOT/$1-$(tool_version "$1")/bin"; }

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

# kube_build WRAPPER_DIR OUT_BIN_DIR PACKAGE...: commands of k8s.io/kubernetes,
# stamped with the version as hack/lib/version.sh does (minus git data).
kube_build() {
    local dir=$1 out=$2 v=$KUBE_VERSION minor major flags=() key val
    shift 2
    major=${v#v}; major=${major%%.*}
    minor=${v#v*.}; minor=${minor%%.*}
    new_wrapper "$dir" k8s.io/kubernetes "$v" kube_staging
    for key in gitVersion=$v gitMajor=$major gitMinor=$minor gitTreeState=clean; do
        for val in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
            flags+=("-X $val.$key")
        done
    done
    wrapper_build "$dir" -tags selinux,notest,grpcnotrace -ldflags "-s -w ${flags[*]}" -o "$out/" "$@"
}

build_kube() {
    kube_build "$1" "$2" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler
}

build_kubelet() {
    kube_build "$1" "$2" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
}

build_csi_provisioner() {
    kubernetes_csi_build "$1" "$2" github.com/kubernetes-csi/external-provisioner/v6 \
        "$CSI_PROVISIONER_VERSION" version csi-provisioner
}

build_jaeger() {
    # Without the (npm-built) UI assets: the binary serves a placeholder page.
    local v=$JAEGER_VERSION
    new_wrapper "$1" github.com/jaegertracing/jaeger "$v"
    wrapper_build "$1" -ldflags "-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion=$v" \
        -o "$2/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
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

# ---- cache handling -----------------------------------------------------------------

CLEANUP=()
cleanup() { [[ ${#CLEANUP[@]} -eq 0 ]] || rm -rf "${CLEANUP[@]}"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

is_built() {
    local b dir
    dir=$(bin_dir "$1")
    for b in $(tool_binaries "$1"); do
        [[ -x $dir/$b ]] || return 1
    done
}

# Build TOOL into a temporary directory under $ROOT, then rename it into place,
# so $ROOT/<tool>-<version> is either complete or absent.
install_tool() {
    local tool=$1 ver dest tmp lock start b
    ver=$(tool_version "$tool")
    dest=$ROOT/$tool-$ver
    if is_built "$tool"; then
        log "$tool $ver: cached in $dest/bin"
        return
    fi
    exec {lock}>"$ROOT/.$tool-$ver.lock"
    flock "$lock"   # another build.sh may be building the same tool
    if is_built "$tool"; then
        log "$tool $ver: cached in $dest/bin"
        exec {lock}>&-
        return
    fi
    rm -rf "$ROOT/.build-$tool-$ver".*   # left by a killed build
    tmp=$(mktemp -d "$ROOT/.build-$tool-$ver.XXXXXX")
    CLEANUP+=("$tmp")
    mkdir -p "$tmp/out/bin"
    log "$tool $ver: building ..."
    start=$SECONDS
    "build_${tool//-/_}" "$tmp/wrapper" "$tmp/out/bin"
    for b in $(tool_binaries "$tool"); do
        [[ -x $tmp/out/bin/$b ]] || die "$tool: $b was not built"
    done
    cp "$tmp/wrapper/go.mod" "$tmp/wrapper/go.sum" "$tmp/out/" # record of what was built
    rm -rf "$dest"   # an incomplete leftover, e.g. hand-made
    mv -T "$tmp/out" "$dest"
    rm -rf "$tmp"
    exec {lock}>&-
    log "$tool $ver: built in $((SECONDS - start))s into $dest/bin"
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
            tool_version "$t" >/dev/null # dies on an unknown tool
            tools+=("$t")
        fi
    done
    if $print; then
        for t in "${tools[@]}"; do bin_dir "$t"; done
        return
    fi
    mkdir -p "$ROOT"
    setup_go
    for t in "${tools[@]}"; do install_tool "$t"; done
}

main "$@"
