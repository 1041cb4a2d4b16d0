"""Wheels for the device machine (Python 3.12, x86-64, no internet): what the benchmarks need there
that its image lacks, in one git-ignored folder that travels with `carry`.

    python benchmarks/device_wheels.py build     # here: pip download the pinned wheels, then check
    python benchmarks/device_wheels.py check     # here: tags, sizes, the requirement closure
    python3 benchmarks/device_wheels.py verify   # there, after device_setup.sh installed them

What is carried (PINS) and why:
- accelbench's load generator (`python -m accelbench.workers.bench`) imports pydantic; aiohttp and
  numpy are on the device already.
- AIPerf 0.13.0 (the version of the earlier local results) and what it needs that the image lacks,
  or pins to a version the image may not have (rich ~= 14.1, psutil ~= 7.0, aiofiles ~= 24.1,
  prometheus-client ~= 0.23; each under 300 kB).
- `transformers serve` of transformers 5.17 (extra `serving`: fastapi, starlette, uvicorn, openai,
  pydantic; rich, torch and accelerate are there). openai 2.54 is the newest release built on
  httpx (the image has httpx 0.28.1); openai 3.x needs httpx2.

Left out on purpose (OMITTED): AIPerf requirements for sub-commands and options these benchmarks
do not use. Without them `aiperf profile` with synthetic prompts and `--ui-type none` ran the same
commands end to end (Python 3.12, only the image's packages plus these wheels; see the serving
README). They would add about 26 MB of the 64 MiB that can travel.

GuideLLM 0.8.1 (client_overhead's third peer): what it needs besides torch, transformers and numpy
(the image's) is pure Python but for ujson and wcwidth, about 5.5 MB in all. datasets, once left
out for AIPerf, is carried for it: guidellm imports it even for synthetic prompts.

Device package list: KINDS.md of the device tool (2026-11-17), with the versions known from its
pip list; a package there without a version is assumed to satisfy what asks for it, and `verify`
checks the real versions on the machine.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_DIR = HERE / ".devicewheels"

PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
MAX_GLIBC = (2, 35)  # the image's python is 3.12.3 (Ubuntu 24.04: glibc 2.39); keep a margin

# name -> version, grouped by who needs them (see the module docstring).
PINS: dict[str, str] = {
    # accelbench.workers.diffusion (the SR3 UNet; its other requirements are on the device)
    "diffusers": "0.42.1",
    "importlib-metadata": "10.2.0",
    "zipp": "4.1.2",
    "lazy-importer": "0.1.0",
    # accelbench.workers.quantize (torchao's formats; torch is the device's)
    "torchao": "0.18.0",
    # accelbench.workers.bench (pydantic models of the API)
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-extensions": "4.16.0",
    "typing-inspection": "0.4.5",
    # aiperf 0.13.0
    "aiperf": "0.13.0",
    "aiofiles": "24.1.0",
    "aiosqlite": "0.22.1",
    "brotli": "1.2.1",
    "crick": "0.0.8",
    "cyclopts": "4.25.3",
    "docstring-parser": "0.18.0",
    "ffmpeg-python": "0.2.0",
    "future": "1.0.0",
    "jmespath": "1.0.1",
    "msgspec": "0.23.0",
    "orjson": "3.11.9",
    "prometheus-client": "0.23.1",
    "psutil": "7.0.0",
    "pydantic-settings": "2.16.3",
    "python-dotenv": "1.2.4",
    "python-multipart": "0.0.34",
    "pyzmq": "26.4.0",
    "rich": "14.1.0",
    "rich-rst": "2.2.0",
    "ruamel-yaml": "0.18.17",
    "ruamel-yaml-clib": "0.2.15",
    "setproctitle": "1.3.8",
    "starlette-compress": "2.0.0",
    "zstandard": "0.25.0",
    # aiperf's uvicorn[standard]; fastapi and uvicorn also serve `transformers serve`
    "fastapi": "0.165.0",
    "starlette": "1.10.0",
    "opentelemetry-api": "1.45.2",
    "uvicorn": "0.55.0",
    "httptools": "0.9.0",
    "watchfiles": "1.3.0",
    "websockets": "17.4",
    # transformers serve (transformers 5.17 extra "serving")
    "openai": "2.54.0",
    "distro": "1.9.0",
    "jiter": "0.19.0",
    "sniffio": "1.3.1",
    # guidellm 0.8.1 (benchmarks/client_overhead --guidellm; torch, transformers, numpy, httpx,
    # pyarrow, pandas, uvloop are on the device; pydantic(-settings), rich, websockets carried above)
    "guidellm": "0.8.1",
    "click": "8.4.2",
    "culsans": "0.10.0",
    "aiologic": "0.17.1",
    "datasets": "5.2.0",  # imported by guidellm's data loading (also for synthetic prompts)
    "dill": "0.4.1",
    "multiprocess": "0.70.19",
    "eval-type-backport": "0.4.0",
    "faker": "40.63.0",
    "ftfy": "6.3.1",
    "wcwidth": "0.9.4",
    "h2": "4.4.1",
    "hpack": "4.2.0",
    "hyperframe": "6.1.0",
    "loguru": "0.7.3",
    "more-itertools": "11.2.1",
    "sanic": "25.12.1",
    "sanic-routing": "23.12.0",
    "html5tagger": "2.0.0",
    "tracerite": "2.6.5",
    "ujson": "6.1.0",
}

OMITTED: dict[str, str] = {
    "dash": "aiperf plot (dashboards); not imported by aiperf profile",
    "dash-bootstrap-components": "aiperf plot",
    "plotly": "aiperf plot",
    "kaleido": "aiperf plot (PNG export)",
    "optuna": "aiperf's parameter search",
    "kopf": "aiperf's Kubernetes operator",
    "kubernetes-asyncio": "aiperf's Kubernetes mode",
    "soundfile": "audio inputs",
    "textual": "the terminal dashboard; the runs pass --ui-type none",
}

# The device image's packages (KINDS.md), with the versions that were read there.
DEVICE_VERSIONS: dict[str, str] = {
    "accelerate": "1.15.0",
    "aiohttp": "3.14.3",
    "httpx": "0.28.1",
    "huggingface-hub": "1.33.0",
    "jax": "0.11.2",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "uvloop": "0.23.0",
}
_DEVICE_PACKAGE_TEXT = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspection urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
DEVICE_PACKAGES = frozenset(_DEVICE_PACKAGE_TEXT.split())

# What the benchmarks run there, as requirements: the closure of these must be met.
ROOTS: dict[str, list[str]] = {
    "accelbench bench worker": ["pydantic>=2.6", "aiohttp>=3.9", "numpy>=1.26"],
    "accelbench diffusion worker": ["diffusers>=0.30"],
    "accelbench quantize worker": ["torchao>=0.14"],
    "aiperf": ["aiperf==0.13.0"],
    # guidellm asks for httpx[http2]; httpx is the device's, so its http2 extra (h2) is named here
    "guidellm": ["guidellm==0.8.1", "h2>=3,<5"],
    # transformers 5.17.0 METADATA, extra "serving"
    "transformers serve": [
        "transformers==5.17.0",
        "openai>=1.98.0",
        "pydantic>=2",
        "uvicorn",
        "fastapi",
        "starlette",
        "rich",
        "torch>=2.5",
        "accelerate>=1.1.0",
    ],
}

# Modules `verify` imports on the device: (module, who needs it, essential).
IMPORTS: list[tuple[str, str, bool]] = [
    ("pydantic", "bench worker, aiperf, transformers serve", True),
    ("aiohttp", "bench worker, aiperf", True),
    ("numpy", "bench worker", True),
    ("torch", "model, transformers serve", True),
    ("transformers", "model, transformers serve, tokenizers for both clients", True),
    ("fastapi", "transformers serve", True),
    ("uvicorn", "transformers serve", True),
    ("openai", "transformers serve", True),
    ("zmq", "aiperf", True),
    ("orjson", "aiperf", True),
    ("aiperf", "aiperf", True),
    ("guidellm", "guidellm (client_overhead peer)", False),
    ("httptools", "uvicorn[standard] (faster HTTP parsing)", False),
    ("uvloop", "uvicorn, aiperf", False),
]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str
    version: str
    tags: str

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def wheels_in(directory: Path) -> dict[str, Wheel]:
    found: dict[str, Wheel] = {}
    for path in sorted(directory.glob("*.whl")):
        parts = path.name[:-4].split("-")
        name = canonical(parts[0])
        if name in found:
            raise SystemExit(f"two wheels of {name} in {directory}: {found[name].path.name}, {path.name}")
        found[name] = Wheel(path, name, parts[1], "-".join(parts[-3:]))
    return found


def tag_ok(tags: str) -> bool:
    """cp312 (or abi3 / pure Python) and any or manylinux x86-64 with glibc <= MAX_GLIBC."""
    interpreters, abis, platforms = tags.split("-")
    python_ok = any(
        i in ("py3", "py2.py3", "cp312", "py312")
        or (i.startswith("cp3") and "abi3" in abis and int(i[3:]) <= 12)
        for i in interpreters.split(".")
    )
    if not python_ok:
        return False
    for platform in platforms.split("."):
        if platform == "any" or platform in ("manylinux1_x86_64", "manylinux2010_x86_64"):
            return True
        if platform == "manylinux2014_x86_64":
            return True
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", platform)
        if m and (int(m.group(1)), int(m.group(2))) <= MAX_GLIBC:
            return True
    return False


def metadata_requires(wheel: Wheel) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel.path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode()
    header = text.split("\n\n", 1)[0].splitlines()
    return [line.split(":", 1)[1].strip() for line in header if line.startswith("Requires-Dist:")]


def marker_environment() -> dict[str, str]:
    return {
        "implementation_name": "cpython",
        "implementation_version": "3.12.3",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": "3.12.3",
        "python_version": "3.12",
        "sys_platform": "linux",
    }


def applies(requirement: object, extras: Iterable[str], environment: dict[str, str]) -> bool:
    marker = getattr(requirement, "marker", None)
    if marker is None:
        return True
    return any(marker.evaluate({**environment, "extra": extra}) for extra in [*extras, ""])


def closure(wheels: dict[str, Wheel]) -> tuple[list[str], list[str], set[str], dict[str, set[str]]]:
    """Walk ROOTS through the carried wheels' Requires-Dist. Returns (problems, notes, the carried
    names reached, who asked for each omitted package)."""
    from packaging.requirements import Requirement

    environment = marker_environment()
    device = {canonical(n) for n in DEVICE_PACKAGES}
    problems: list[str] = []
    notes: list[str] = []
    reached: set[str] = set()
    omitted: dict[str, set[str]] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    queue: list[tuple[str, str]] = [(r, f"root: {group}") for group, rs in ROOTS.items() for r in rs]
    while queue:
        text, parent = queue.pop(0)
        req = Requirement(text)
        name = canonical(req.name)
        extras = tuple(sorted(req.extras))
        if name in OMITTED:
            omitted.setdefault(name, set()).add(parent)
            continue
        wheel = wheels.get(name)
        if wheel is not None:
            if req.specifier and not req.specifier.contains(wheel.version, prereleases=True):
                problems.append(f"{parent} needs {text}; carried {name} {wheel.version}")
            reached.add(name)
            if (name, extras) in seen:
                continue
            seen.add((name, extras))
            for child in metadata_requires(wheel):
                child_req = Requirement(child)
                if applies(child_req, extras, environment):
                    queue.append((child, f"{name} {wheel.version}"))
            continue
        if name in device:
            version = DEVICE_VERSIONS.get(name)
            if version is None:
                if req.specifier:
                    notes.append(f"{parent} needs {text}: on the device, version unknown (verify checks)")
            elif req.specifier and not req.specifier.contains(version, prereleases=True):
                problems.append(f"{parent} needs {text}; the device has {name} {version}")
            continue
        problems.append(f"{parent} needs {text}: neither carried nor on the device")
    return problems, sorted(set(notes)), reached, omitted


def check(directory: Path) -> int:
    wheels = wheels_in(directory)
    if not wheels:
        print(f"no wheels in {directory}: run `build` first")
        return 1
    problems: list[str] = []
    total = 0
    print(f"{'wheel':78} {'MB':>6}")
    for wheel in sorted(wheels.values(), key=lambda w: -w.size):
        total += wheel.size
        flag = "" if tag_ok(wheel.tags) else "  <- tag not for cp312 manylinux x86-64"
        if flag:
            problems.append(f"{wheel.path.name}: tag not installable on the device")
        print(f"{wheel.path.name[:78]:78} {wheel.size / 1e6:6.2f}{flag}")
    print(f"{len(wheels)} wheels, {total / 1e6:.1f} MB ({total / 2**20:.1f} MiB)")
    for name in sorted(set(PINS) - set(wheels)):
        problems.append(f"pinned {name}=={PINS[name]} has no wheel here (run build)")
    for name, wheel in wheels.items():
        if name in PINS and PINS[name] != wheel.version:
            problems.append(f"{wheel.path.name}: pinned {PINS[name]}")
        if name not in PINS:
            problems.append(f"{wheel.path.name}: not in PINS (stale? `build` removes it)")
    more, notes, reached, omitted = closure(wheels)
    problems += more
    unused = sorted(set(wheels) - reached)
    if unused:
        problems.append(f"carried but needed by nothing: {', '.join(unused)}")
    print("\nleft out on purpose (requirement of -> reason):")
    for name, parents in sorted(omitted.items()):
        print(f"  {name}: {', '.join(sorted(parents))} -> {OMITTED[name]}")
    if notes:
        print("\nmet by the device's packages whose version is not known here:")
        for note in notes:
            print(f"  {note}")
    if problems:
        print("\nPROBLEMS:")
        for problem in problems:
            print(f"  {problem}")
        return 1
    print("\nclosure complete: each requirement is carried, on the device, or left out on purpose")
    return 0


def build(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    existing = wheels_in(directory)
    for name, wheel in existing.items():
        if PINS.get(name) != wheel.version:
            print(f"removing {wheel.path.name}")
            wheel.path.unlink()
    wanted = [f"{n}=={v}" for n, v in PINS.items() if n not in existing or existing[n].version != v]
    if wanted:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", PYTHON_VERSION, "--implementation", "cp",
            *[x for p in PLATFORMS for x in ("--platform", p)], "-d", str(directory), *wanted,
        ]  # fmt: skip
        print(" ".join(command))
        subprocess.run(command, check=True)
    return check(directory)


# --------------------------------------------------------------------------------------------------
# On the device


def verify() -> int:
    """Import what the benchmarks import and check the carried wheels' requirements against what is
    installed (sys.path, so PYTHONPATH=/tmp/site counts). Exit 1 when an essential import fails."""
    from importlib import metadata

    sys.path.insert(0, str(REPO / "operator"))
    path = os.environ.get("PYTHONPATH", "")
    print(f"python {sys.version.split()[0]} at {sys.executable}; PYTHONPATH={path}")
    failed = []
    for module, who, essential in IMPORTS:
        try:
            mod = importlib.import_module(module)
            where = str(Path(getattr(mod, "__file__", "") or "?").parent)
            version = getattr(mod, "__version__", "")
            print(f"  ok       {module:14} {version:12} {where}  ({who})")
        except Exception as exc:  # any failure means "not usable"
            print(f"  MISSING  {module:14} {type(exc).__name__}: {str(exc)[:150]}  ({who})")
            if essential:
                failed.append(module)
    checks = {
        "transformers serve": "from transformers.utils.import_utils import is_serve_available as f;"
        " assert f(), 'is_serve_available() is False';"
        " import transformers.cli.serving.server, transformers.cli.serving.completion,"
        " transformers.cli.serving.chat_completion, transformers.cli.serve",
        "aiperf cli": "import aiperf.cli",
        "accelbench bench worker": "import accelbench.workers.bench.main",
    }
    for label, code in checks.items():
        try:
            exec(code, {})
            print(f"  ok       {label}")
        except Exception as exc:
            print(f"  FAILED   {label}: {type(exc).__name__}: {str(exc)[:300]}")
            failed.append(label)
    try:
        from packaging.requirements import Requirement
    except ImportError:
        print("packaging is missing: requirement check skipped")
        return 1 if failed else 0
    installed: dict[str, str] = {}
    for dist in metadata.distributions():  # sys.path order: the first one found is the one imported
        installed.setdefault(canonical(dist.metadata["Name"]), dist.version)
    print("versions: " + ", ".join(f"{n} {installed.get(n, '-')}" for n in sorted(DEVICE_VERSIONS)))
    unmet: list[str] = []
    for name in sorted(PINS):
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            unmet.append(f"{name} is not installed")
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = canonical(req.name)
            if dep in OMITTED:
                continue
            have = installed.get(dep)
            if have is None:
                unmet.append(f"{name} needs {text}: not installed")
            elif req.specifier and not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{name} needs {text}: {dep} {have} is installed")
    print("requirements of the carried packages: " + ("all met" if not unmet else f"{len(unmet)} unmet"))
    for line in unmet:
        print(f"  {line}")
    if failed:
        print(f"NOT READY: {', '.join(failed)}")
        return 1
    print("ready")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("command", choices=("build", "check", "verify"))
    parser.add_argument("--dir", default=str(DEFAULT_DIR), help="wheel folder (default %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "verify":
        return verify()
    directory = Path(args.dir)
    return build(directory) if args.command == "build" else check(directory)


if __name__ == "__main__":
    sys.exit(main())
