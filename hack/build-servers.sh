#!/usr/bin/env bash
# Builds the servers tests run beside the operator (hack/servers/<name>/go.mod pins each one) and
# links them into <repo>/.servers/: fake-gcs-server (the GCS JSON API, reached by google-cloud-storage
# through STORAGE_EMULATOR_HOST) and versitygw (an S3 gateway, reached by boto3 through
# AWS_ENDPOINT_URL_S3), started by hack/objectstores.py; Flux's source-controller and
# kustomize-controller, with the CRDs of the same module versions copied into .servers/flux-crds/,
# started by hack/flux.py; Kueue, with its CRDs and webhook configurations in .servers/kueue-crds/
# and .servers/kueue-webhooks/, started by hack/kueue.py; KubeRay's ray-operator with its CRDs in
# .servers/kuberay-crds/, the Go peer of the scale benchmark; actionlint, which lints the release
# workflow (.github/workflows) that cannot run here.
#
# Cached per server like the control plane (hack/build-binaries.sh):
# $HOME/.cache/accelbench/servers/<name>-<key>/, <key> hashing that server's go.mod/go.sum and this
# script, so pinning a new server builds only that one; a warm run only re-creates the links.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULES_DIR="$REPO/hack/servers"
LINK_DIR="$REPO/.servers"

export GOMODCACHE="${GOMODCACHE:-$HOME/.cache/go-mod}"
export GOCACHE="${GOCACHE:-$HOME/.cache/go-build}"
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

log() { printf '[build-servers] %s\n' "$*"; }

# CRDs a server needs, copied from the module it is built from (so they match its version):
# <server> -> "<module> <folder in the module> <folder under .servers/>".
declare -A CRDS_FROM=(
    [source-controller]="github.com/fluxcd/source-controller config/crd/bases flux-crds"
    [kustomize-controller]="github.com/fluxcd/kustomize-controller config/crd/bases flux-crds"
    [kueue]="sigs.k8s.io/kueue config/components/crd/bases kueue-crds"
    [kuberay]="github.com/ray-project/kuberay/ray-operator config/crd/bases kuberay-crds"
)
# Other files a server needs from its module: <server> -> "<module> <file> <folder under .servers/>".
declare -A FILES_FROM=(
    [kueue]="sigs.k8s.io/kueue config/components/webhook/manifests.yaml kueue-webhooks"
)

cache_root="$HOME/.cache/accelbench/servers"
mkdir -p "$cache_root"

server_key() { # <name>: hash of its pins and of this script's code (comments may change freely)
    cd "$REPO"
    {
        sha256sum "hack/servers/$1/go.mod" "hack/servers/$1/go.sum"
        grep -v '^[[:space:]]*#' hack/build-servers.sh | sha256sum
    } | sha256sum | cut -c1-16
}

copy_from_module() { # <dir> <module> <path in module> <target under the output> [glob]
    local dir="$1" module="$2" path="$3" target="$4" moddir
    moddir="$(cd "$dir" && go list -m -f '{{.Dir}}' "$module")"
    mkdir -p "$tmp/$target"
    if [ -d "$moddir/$path" ]; then
        install -m 0644 "$moddir/$path"/*.yaml "$tmp/$target/"
    else
        install -m 0644 "$moddir/$path" "$tmp/$target/"
    fi
    log "copied $path of $module into $target/"
}

outs=()
for dir in "$MODULES_DIR"/*/; do
    name="$(basename "$dir")"
    out="$cache_root/$name-$(server_key "$name")"
    outs+=("$out")
    if [ -f "$out/.complete" ]; then
        log "cache hit: $out"
        continue
    fi
    # One build of a server at a time (another clone may be building it); others go on.
    exec 9>"$out.lock"
    flock 9
    if [ -f "$out/.complete" ]; then
        log "built meanwhile: $out"
        exec 9>&-
        continue
    fi
    tmp="$cache_root/.tmp-$name-$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    tool="$(sed -n 's/^tool //p' "$dir/go.mod")"
    log "building $name ($tool)"
    (cd "$dir" && go build -trimpath -ldflags="-s -w" -o "$tmp/$name" "$tool")
    if [ -n "${CRDS_FROM[$name]:-}" ]; then
        copy_from_module "$dir" ${CRDS_FROM[$name]}
    fi
    if [ -n "${FILES_FROM[$name]:-}" ]; then
        copy_from_module "$dir" ${FILES_FROM[$name]}
    fi
    touch "$tmp/.complete"
    rm -rf "$out" && mv "$tmp" "$out"
    exec 9>&-
done
# Keep the newest three builds of each server (other clones may still link an older one).
for dir in "$MODULES_DIR"/*/; do
    name="$(basename "$dir")"
    find "$cache_root" -maxdepth 1 -type d -name "$name-*" -printf '%T@ %p\n' | sort -rn | tail -n +4 |
        cut -d' ' -f2- | while read -r old; do rm -rf "$old" "$old.lock"; done
done
rm -rf "$LINK_DIR" && mkdir -p "$LINK_DIR" # only links live here
for out in "${outs[@]}"; do
    for f in "$out"/*; do
        # Two servers may share a CRD folder (Flux's): link its files one by one.
        if [ -d "$f" ]; then
            mkdir -p "$LINK_DIR/$(basename "$f")"
            for g in "$f"/*; do ln -sf "$g" "$LINK_DIR/$(basename "$f")/$(basename "$g")"; done
        else
            ln -s "$f" "$LINK_DIR/$(basename "$f")"
        fi
    done
done
log "linked $(find "$LINK_DIR" -maxdepth 1 | tail -n +2 | wc -l) server(s) and folder(s) into $LINK_DIR"
