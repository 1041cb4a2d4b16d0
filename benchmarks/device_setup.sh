# Device machine set-up for the benchmarks: install the carried wheels and say what imports.
#
#   source benchmarks/device_setup.sh            # repository root, on the device (bash)
#
# Installs benchmarks/.devicewheels/*.whl (made here by `python benchmarks/device_wheels.py build`;
# name the folder in the run's carry list) into /tmp/site with the image's python3 (the venv in
# /opt/torch/.venv that holds torch and transformers), without an index and without resolving,
# then exports PYTHONPATH=/tmp/site:operator so every later python3 of the same command sees the
# wheels and this checkout's accelbench, and runs `device_wheels.py verify`.
# Sourced, it returns 1 when something essential does not import; run with bash, it exits so.
# Override the places with ACCELBENCH_WHEELS and ACCELBENCH_SITE.

_ab_setup() {
    local wheels="${ACCELBENCH_WHEELS:-benchmarks/.devicewheels}"
    local site="${ACCELBENCH_SITE:-/tmp/site}"
    local started=$SECONDS
    if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
        echo "device_setup: no wheels in $wheels (carry it: benchmarks/.devicewheels)" >&2
        return 1
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$wheels"/*.whl || return 1
    export PYTHONPATH="$site:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"
    # No HF_HUB_OFFLINE here: AIPerf 0.13 cannot load a tokenizer from a local directory in
    # offline mode. The scripts set it where it helps (transformers serve, the model build).
    export HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
    echo "device_setup: $(ls "$wheels"/*.whl | wc -l) wheels into $site in $((SECONDS - started)) s;" \
        "PYTHONPATH=$PYTHONPATH"
    python3 benchmarks/device_wheels.py verify
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    _ab_setup
    exit $?
fi
_ab_setup
