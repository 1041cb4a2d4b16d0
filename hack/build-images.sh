#!/usr/bin/env bash
# Builds the images under images/ with buildah (no Docker engine here, and upstream base images
# cannot be pulled) and records what came out (issue 21).
#
#   hack/build-images.sh [--smoke] [--out FILE] [NAME ...]     (default: every images/<NAME>/)
#
# - The base: Debian bookworm made with debootstrap (minbase, python3 3.11, python3-venv,
#   python-is-python3, ca-certificates), apt caches, docs, man pages and locales removed, imported
#   as localhost/accelbench-base:bookworm-py311. Each Dockerfile takes it as BASE_IMAGE (its
#   default is the upstream image a user would build from).
# - buildah as root with the vfs storage driver and chroot isolation, storage under
#   $HOME/.cache/accelbench/containers (ACCELBENCH_IMAGE_STORE names another, e.g. to build the
#   workers beside a test run that uses the default one) so a warm run reuses layers; pip's cache
#   is mounted into the build so wheels are downloaded once.
# - Per image: build seconds, size (MB, what `podman images` reports), layer count, and with
#   --smoke the entrypoint run once (`--help`, as the image's user), its framework imported,
#   `accelbench --version` run, and for a worker image what its venv holds outside its framework's
#   own dependency closure (hack/image_contents.py, run with the image's python).
#
# worker-torch-gaudi's upstream base (Habana's SynapseAI image with its own torch) cannot be fetched
# here: it is built on the local base instead, which checks everything after its FROM except that
# Habana's torch is the one present (pip brings PyPI's torch instead).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$HOME/.cache/accelbench"
CONTAINERS="${ACCELBENCH_IMAGE_STORE:-$CACHE/containers}"
STORE=(--root "$CONTAINERS/storage" --runroot "$CONTAINERS/run" --storage-driver vfs)
BASE_TAG="localhost/accelbench-base:bookworm-py311"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml" | head -1)"
REVISION="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"

log() { printf '[build-images] %s\n' "$*" >&2; }

# vfs keeps every layer as a full copy, so superseded builds pile up gigabytes (19 GB after a day of
# rebuilds, which filled the disk under CI). Past this budget the store drops what no tag names:
# leftover working containers of interrupted builds and untagged images (old builds and the layer
# cache, which the next build makes again once).
STORE_BUDGET_GB="${ACCELBENCH_IMAGE_STORE_GB:-8}"
trim_store() {
    local used_gb
    used_gb=$(($(du -sk "$CONTAINERS/storage" 2>/dev/null | cut -f1) / 1048576))
    if [ "$used_gb" -ge "$STORE_BUDGET_GB" ]; then
        log "image store holds ${used_gb} GB (budget ${STORE_BUDGET_GB} GB): removing untagged images"
        buildah "${STORE[@]}" rm --all >/dev/null || true
        buildah "${STORE[@]}" rmi --prune >/dev/null || true
    fi
}

# The workers' venvs hold several GB of CUDA libraries, and vfs copies the whole root filesystem
# for every step it caches: a worker build with a cache layer per step needed over 45 GB and filled
# the disk. Those build each stage in one working container instead (no per-step cache), after
# dropping what no tag names.
layer_cache() {
    case "$1" in
    worker-*)
        buildah "${STORE[@]}" rmi --prune >/dev/null 2>&1 || true
        echo "--layers=false"
        ;;
    *) echo "--layers" ;;
    esac
}

need() {
    local missing=()
    for tool in buildah podman debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            log "installing ${missing[*]} (apt)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah podman debootstrap >/dev/null
        else
            log "missing ${missing[*]}: install buildah, podman and debootstrap (Debian: apt-get install)"
            exit 1
        fi
    fi
}

# What the base is made of; a change of it (or of make_base below) makes a new base.
BASE_PACKAGES="python3,python3-venv,python-is-python3,ca-certificates"
base_key() { { echo "bookworm $BASE_PACKAGES"; declare -f make_base; } | sha256sum | cut -c1-16; }

make_base() {
    local key rootfs ctr
    key="$(base_key)"
    if buildah "${STORE[@]}" inspect --type image --format '{{index .ImageAnnotations "accelbench.base-key"}}' \
        "$BASE_TAG" 2>/dev/null | grep -qx "$key"; then
        log "base cached: $BASE_TAG ($key)"
        return
    fi
    rootfs="$CACHE/images/rootfs-$key"
    rm -rf "$rootfs" && mkdir -p "$CACHE/images"
    log "debootstrap bookworm into $rootfs"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" "$MIRROR" >"$CACHE/images/debootstrap.log" 2>&1
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
    ctr="$(buildah "${STORE[@]}" from scratch)"
    tar -C "$rootfs" -cf "$CACHE/images/base.tar" .
    buildah "${STORE[@]}" add "$ctr" "$CACHE/images/base.tar" /
    buildah "${STORE[@]}" config --annotation "accelbench.base-key=$key" --cmd python \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 "$ctr"
    buildah "${STORE[@]}" commit --rm "$ctr" "$BASE_TAG" >/dev/null
    rm -rf "$rootfs" "$CACHE/images/base.tar"
    log "base committed: $BASE_TAG"
}

# The entrypoint's module and what a smoke run imports, per image.
smoke_import() {
    case "$1" in
    operator) echo "import accelbench.controller" ;;
    bench) echo "import accelbench.workers.bench" ;;
    worker-torch-cuda | worker-torch-gaudi) echo "import torch, transformers, peft, accelbench.workers.finetune" ;;
    worker-jax-cuda | worker-jax-tpu) echo "import jax, flax, optax, accelbench.workers.finetune" ;;
    *) echo "import accelbench" ;;
    esac
}

# The framework a worker image exists to carry (pip requirement), for hack/image_contents.py; the
# Gaudi image built here holds PyPI's torch in place of Habana's.
framework_of() {
    case "$1" in
    worker-torch-cuda | worker-torch-gaudi) echo "torch" ;;
    worker-jax-cuda) echo "jax[cuda12]" ;;
    worker-jax-tpu) echo "jax[tpu]" ;;
    esac
}

# `buildah run` (chroot isolation, as the build's RUN steps) rather than `podman run`: this
# machine's seccomp refuses the setrlimit calls an OCI runtime makes (crun: RLIMIT_NOFILE, EPERM).
smoke_run() {
    local tag="$1" name="$2" ctr entry
    entry="$(buildah "${STORE[@]}" inspect --type image "$tag" |
        python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["OCIv1"]["config"]["Entrypoint"]))')"
    ctr="$(buildah "${STORE[@]}" from --quiet "$tag")"
    # shellcheck disable=SC2086  # the entrypoint is words
    if ! buildah "${STORE[@]}" run --isolation chroot --network host "$ctr" -- $entry --help >/dev/null ||
        ! buildah "${STORE[@]}" run --isolation chroot "$ctr" -- python -c "$(smoke_import "$name")" ||
        ! buildah "${STORE[@]}" run --isolation chroot "$ctr" -- accelbench --version; then
        buildah "${STORE[@]}" rm "$ctr" >/dev/null
        log "$tag: smoke run failed"
        return 1
    fi
    # Worker images: the framework's closure against the rest, into $CONTENTS (JSON) for the record.
    CONTENTS=null
    if [ -n "$(framework_of "$name")" ]; then
        CONTENTS="$(buildah "${STORE[@]}" run --isolation chroot \
            --volume "$REPO/hack/image_contents.py:/tmp/image_contents.py:ro" "$ctr" -- \
            python /tmp/image_contents.py "$(framework_of "$name")")"
    fi
    buildah "${STORE[@]}" rm "$ctr" >/dev/null
}

main() {
    local smoke=0 out="" names=()
    while [ $# -gt 0 ]; do
        case "$1" in
        --smoke) smoke=1 ;;
        --out) out="$2"; shift ;;
        *) names+=("$1") ;;
        esac
        shift
    done
    if [ ${#names[@]} -eq 0 ]; then
        for d in "$REPO"/images/*/; do names+=("$(basename "$d")"); done
    fi
    need
    mkdir -p "$CONTAINERS" "$HOME/.cache/pip"
    make_base
    local results="[]" name tag start seconds size layers smoked trust=()
    # Builds reach PyPI through this machine's TLS setup: its CA bundle (which may hold a proxy's
    # CA) is mounted for the RUN steps only, with a pip.conf naming it; neither ends up in an image.
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$CONTAINERS/pip.conf"
        trust=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro
            --volume "$CONTAINERS/pip.conf:/etc/pip.conf:ro")
    fi
    for name in "${names[@]}"; do
        tag="ghcr.io/accelbench/$name:$VERSION"
        log "building $tag"
        start=$(date +%s)
        buildah "${STORE[@]}" bud --isolation chroot "$(layer_cache "$name")" --quiet \
            --volume "$HOME/.cache/pip:/root/.cache/pip" "${trust[@]}" \
            --build-arg "BASE_IMAGE=$BASE_TAG" --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" \
            -f "$REPO/images/$name/Dockerfile" -t "$tag" "$REPO" >/dev/null
        seconds=$(($(date +%s) - start))
        size="$(podman "${STORE[@]}" image inspect --format '{{.Size}}' "$tag")"
        layers="$(podman "${STORE[@]}" image inspect --format '{{len .RootFS.Layers}}' "$tag")"
        smoked=null CONTENTS=null
        if [ "$smoke" = 1 ]; then
            smoke_run "$tag" "$name"
            smoked="\"entrypoint --help; $(smoke_import "$name"); accelbench --version\""
        fi
        log "$tag: $((size / 1000000)) MB, $layers layers, built in ${seconds}s"
        results="$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r.append({"image": sys.argv[2], "size_mb": round(int(sys.argv[3])/1e6, 1), "layers": int(sys.argv[4]), "build_s": int(sys.argv[5]), "smoke": json.loads(sys.argv[6]), "contents": json.loads(sys.argv[7])}); print(json.dumps(r))' \
            "$results" "$tag" "$size" "$layers" "$seconds" "$smoked" "$CONTENTS")"
    done
    trim_store
    if [ -n "$out" ]; then
        # Merged into what --out already records, one entry per image, each with its own date and
        # command, so images built at different times (the workers take long) share one file.
        python3 - "$results" "$BASE_TAG" "$out" "${names[@]}" <<'PY'
import datetime, json, os, platform, sys
results, base, out, names = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
command = "hack/build-images.sh --smoke " + " ".join(names)
try:
    with open(out) as f:
        earlier = json.load(f).get("images", [])
except (OSError, ValueError):
    earlier = []
built = {r["image"] for r in results}
for r in results:
    r.update(date=date, command=command)
doc = {
    "machine": {"nproc": os.cpu_count(), "kernel": platform.release()},
    "base": base,
    "buildah": os.popen("buildah --version").read().strip(),
    "images": [r for r in earlier if r["image"] not in built] + results,
}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
PY
    fi
    echo "$results"
}

main "$@"
