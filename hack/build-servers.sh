#!/usr/bin/env bash
# Builds the servers tests run beside the operator (hack/servers/<name>/go.mod pins each one) and
# links them into <repo>/.servers/: fake-gcs-server (the GCS JSON API, reached by google-cloud-storage
# through STORAGE_EMULATOR_HOST) and versitygw (an S3 gateway, reached by boto3 through
# AWS_ENDPOINT_URL_S3), started by hack/objectstores.py; Flux's source-controller and
# kustomize-controller, with the CRDs of the same module versions copied into .servers/flux-crds/,
# started by hack/flux.py.
#
# Cached like the control plane (hack/build-binaries.sh): $HOME/.cache/accelbench/servers/<key>/,
# <key> hashing every go.mod/go.sum here and this script; a warm run only re-creates the links.
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
)

key="$(
    cd "$REPO"
    { find hack/servers -name 'go.mod' -o -name 'go.sum'; echo hack/build-servers.sh; } | LC_ALL=C sort |
        while read -r f; do printf '%s  ' "$f"; sha256sum "$f" | cut -d' ' -f1; done | sha256sum | cut -c1-16
)"
cache_root="$HOME/.cache/accelbench/servers"
out="$cache_root/$key"
mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9
if [ -f "$out/.complete" ]; then
    log "cache hit: $out"
else
    tmp="$cache_root/.tmp-$key-$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    for dir in "$MODULES_DIR"/*/; do
        name="$(basename "$dir")"
        tool="$(sed -n 's/^tool //p' "$dir/go.mod")"
        log "building $name ($tool)"
        (cd "$dir" && go build -trimpath -ldflags="-s -w" -o "$tmp/$name" "$tool")
        if [ -n "${CRDS_FROM[$name]:-}" ]; then
            read -r module folder target <<<"${CRDS_FROM[$name]}"
            moddir="$(cd "$dir" && go list -m -f '{{.Dir}}' "$module")"
            mkdir -p "$tmp/$target"
            install -m 0644 "$moddir/$folder"/*.yaml "$tmp/$target/"
            log "copied $(find "$moddir/$folder" -name '*.yaml' | wc -l) CRD(s) of $module into $target/"
        fi
    done
    touch "$tmp/.complete"
    rm -rf "$out" && mv "$tmp" "$out"
fi
mkdir -p "$LINK_DIR"
find "$LINK_DIR" -maxdepth 1 -type l -delete
for f in "$out"/*; do ln -s "$f" "$LINK_DIR/$(basename "$f")"; done
log "linked $(find "$LINK_DIR" -maxdepth 1 -type l | wc -l) server(s) and CRD folder(s) into $LINK_DIR"
