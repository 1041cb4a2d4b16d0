"""What an image's Python environment is made of: the framework's own dependency closure against the
rest, in installed bytes. Run inside the image with its own interpreter (build-images.sh --smoke
does, for each worker image), so markers and installed versions are the image's:

    python image_contents.py 'jax[tpu]'        # prints one JSON object

The framework requirement (e.g. `torch`, `jax[cuda12]`) is walked through every installed
distribution's Requires-Dist, extras and markers evaluated; whatever is installed outside that
closure is what accelbench and its other extras add. It answers issue 21's question of whether a
worker image is larger than its framework's wheels require.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

MB = 1e6


def installed_bytes(dist: metadata.Distribution) -> int:
    total = 0
    for file in dist.files or ():
        path = Path(str(dist.locate_file(file)))
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def closure(root: str, dists: dict[str, metadata.Distribution]) -> set[str]:
    """Canonical names of `root` and everything it requires, transitively, as installed here."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(root)]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in seen or name not in dists:
            continue
        seen.add(key)
        for text in dists[name].requires or ():
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in req.extras or {""}):
                todo.append(sub)
    return {name for name, _ in seen}


def main(root: str) -> None:
    dists = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()}
    sizes = {name: installed_bytes(dist) for name, dist in dists.items()}
    framework = closure(root, dists)
    rest = {name: size for name, size in sizes.items() if name not in framework}
    largest = sorted(rest.items(), key=lambda item: -item[1])[:10]
    print(
        json.dumps(
            {
                "framework": root,
                "framework_mb": round(sum(sizes[n] for n in framework) / MB, 1),
                "rest_mb": round(sum(rest.values()) / MB, 1),
                "largest_rest_mb": {name: round(size / MB, 1) for name, size in largest},
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
