#!/usr/bin/env bash
# Builds the local control-plane binaries (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, helm, kubeconform)
# from the Go modules pinned under hack/controlplane/ and links them into
# <repo>/.bin/.
#
# Why a cache outside the repo: CI runs in a fresh clone on the same machine,
# and a cold build of the Kubernetes binaries takes many minutes on 2 cores.
# Binaries live in $HOME/.cache/accelbench/bin/<key>/, where <key> hashes every
# go.mod/go.sum and this script, so any pin change produces a new directory and
# a warm run only re-creates the links.
#
# Usage: hack/build-binaries.sh            (idempotent)
#        ACCELBENCH_BIN_CACHE=/path hack/build-binaries.sh
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULES_DIR="$REPO/hack/controlplane"
LINK_DIR="$REPO/.bin"

export GOMODCACHE="${GOMODCACHE:-$HOME/.cache/go-mod}"
export GOCACHE="${GOCACHE:-$HOME/.cache/go-build}"
# The pins in go.mod/go.sum are the contract: never let a build rewrite them.
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

K8S_VERSION="v1.36.3"
HELM_VERSION="v4.3.2"
KUBECONFORM_VERSION="v0.8.0"

log() { printf '[build-binaries] %s\n' "$*"; }

cache_key() {
    # Sorted file list so the key does not depend on directory iteration order.
    (
        cd "$REPO"
        find hack/controlplane -name 'go.mod' -o -name 'go.sum' | LC_ALL=C sort
        echo hack/build-binaries.sh
    ) | while read -r f; do
        printf '%s  ' "$f"
        sha256sum "$REPO/$f" | cut -d' ' -f1
    done | sha256sum | cut -c1-16
}

# go build wrapper: stripped, reproducible paths, run inside one pinned module.
# $2 is a directory (ending in /) for several packages, or a file for one.
gobuild() {
    local module="$1" out="$2" ldflags="$3"
    shift 3
    log "building $* (module $module)"
    (cd "$MODULES_DIR/$module" && go build -trimpath -ldflags="-s -w $ldflags" -o "$out" "$@")
}

k8s_ldflags() {
    local minor="${K8S_VERSION#v1.}"
    minor="${minor%%.*}"
    local flags="" pkg
    # Without these the binaries report v0.0.0-master and kubectl warns about skew.
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1"
        flags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    echo "$flags"
}

# kwok ships its default Stage objects as YAML inside its module (kwokctl embeds
# them); the kwok binary itself has no built-in stages, so we hand it the same
# files through --config. Reading them from the pinned module keeps them in
# lock-step with the binary. Two pod profiles:
#   fast    - pods go Running and (Job pods) Succeeded at once (kwokctl's default)
#   general - per-pod delays via annotations such as
#             pod-complete.stage.kwok.x-k8s.io/delay, to keep pods Running
write_kwok_stages() {
    local out_dir="$1" src profile f
    src="$(cd "$MODULES_DIR/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
    local node_stages=(node/fast/node-initialize.yaml
        node/heartbeat-with-lease/node-heartbeat-with-lease.yaml)
    local fast=(pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)
    local general=(pod/general/pod-create.yaml pod/general/pod-init-container-running.yaml
        pod/general/pod-init-container-completed.yaml pod/general/pod-ready.yaml
        pod/general/pod-complete.yaml pod/general/pod-delete.yaml)
    for profile in fast general; do
        local -n pod_stages="$profile"
        : >"$out_dir/kwok-stages-$profile.yaml"
        for f in "${node_stages[@]}" "${pod_stages[@]}"; do
            printf -- '---\n' >>"$out_dir/kwok-stages-$profile.yaml"
            cat "$src/$f" >>"$out_dir/kwok-stages-$profile.yaml"
        done
    done
}

build_all() {
    local out="$1"
    # The etcd main package is the module root, so name the output explicitly.
    gobuild etcd "$out/etcd" "" go.etcd.io/etcd/server/v3
    gobuild kube "$out/" "$(k8s_ldflags)" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kubectl
    gobuild kwok "$out/" "" sigs.k8s.io/kwok/cmd/kwok
    gobuild helm "$out/" "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
        helm.sh/helm/v4/cmd/helm
    gobuild kubeconform "$out/" "-X main.version=$KUBECONFORM_VERSION" \
        github.com/yannh/kubeconform/cmd/kubeconform
    write_kwok_stages "$out"
}

link_into_repo() {
    local bin_dir="$1" f
    mkdir -p "$LINK_DIR"
    # Drop links from an older key so .bin never mixes versions.
    find "$LINK_DIR" -maxdepth 1 -type l -delete
    for f in "$bin_dir"/*; do
        ln -s "$f" "$LINK_DIR/$(basename "$f")"
    done
    log "linked $(find "$LINK_DIR" -maxdepth 1 -type l | wc -l) files into $LINK_DIR"
}

# Each key directory is ~0.5 GiB: keep the newest few (other clones or branches
# may use older pins), drop the rest.
prune_old_keys() {
    local cache_root="$1" keep="$2" dir
    find "$cache_root" -mindepth 1 -maxdepth 1 -type d -name '[0-9a-f]*' -printf '%T@ %p\n' |
        sort -rn | tail -n +$((keep + 1)) | cut -d' ' -f2- |
        while read -r dir; do
            log "pruning old cache $dir"
            rm -rf -- "$dir"
        done
}

main() {
    local key cache_root bin_dir tmp start
    key="$(cache_key)"
    cache_root="${ACCELBENCH_BIN_CACHE:-$HOME/.cache/accelbench/bin}"
    bin_dir="$cache_root/$key"
    mkdir -p "$cache_root"

    # Serialise concurrent invocations (e.g. two test sessions starting together).
    exec 9>"$cache_root/.lock"
    flock 9

    if [[ -f "$bin_dir/.complete" ]]; then
        log "cache hit: $bin_dir"
    else
        log "cache miss: building into $bin_dir (cold builds take a while on 2 cores)"
        start=$SECONDS
        tmp="$cache_root/.tmp-$key-$$"
        rm -rf "$tmp"
        mkdir -p "$tmp"
        build_all "$tmp"
        touch "$tmp/.complete"
        rm -rf "$bin_dir"
        mv "$tmp" "$bin_dir" # atomic: a half-built dir is never seen as complete
        log "built in $((SECONDS - start))s"
        prune_old_keys "$cache_root" 3
    fi
    link_into_repo "$bin_dir"
}

main "$@"
