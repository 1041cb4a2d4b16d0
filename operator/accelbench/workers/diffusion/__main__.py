"""Train an SR3 super-resolution model on a folder of images and write the report as JSON.

    python -m accelbench.workers.diffusion --data DIR --size 64 --scale 4 --steps 100 --out report.json
    torchrun --nproc-per-node 2 -m accelbench.workers.diffusion --data DIR ...   # data parallel

The last --eval-images images of --data (sorted by path) are held out unless --eval-data names
another folder. --synthetic N first writes N synthetic images into --data (tests, benchmarks).
Exit codes: 0 done, ExitCode.INVALID_CONFIG for inputs that cannot work.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ...api.contract import ExitCode
from .. import InvalidConfigError
from ..jobenv import dist_env
from .images import load_images, make_sr_dataset
from .sr3 import SRSettings, train


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = SRSettings()
    parser = argparse.ArgumentParser(
        prog="python -m accelbench.workers.diffusion", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data", required=True, help="folder of training images (PNG/JPEG)")
    parser.add_argument("--eval-data", help="folder of held-out images (default: the tail of --data)")
    parser.add_argument("--eval-images", type=int, default=16, help="held-out images to sample and score")
    parser.add_argument("--synthetic", type=int, default=0, help="first write this many synthetic images")
    parser.add_argument("--size", type=int, default=defaults.size)
    parser.add_argument("--scale", type=int, default=defaults.scale)
    parser.add_argument("--channels", default=",".join(map(str, defaults.channels)))
    parser.add_argument("--layers-per-block", type=int, default=defaults.layers_per_block)
    parser.add_argument("--attention-levels", type=int, default=defaults.attention_levels)
    parser.add_argument("--batch", type=int, default=defaults.batch, help="global images per step")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=defaults.precision)
    parser.add_argument("--sample-steps", type=int, default=defaults.sample_steps)
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", help="report JSON (rank 0 writes it)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    dist = dist_env("pytorch")
    try:
        settings = SRSettings(
            size=args.size,
            scale=args.scale,
            channels=tuple(int(c) for c in args.channels.split(",")),
            layers_per_block=args.layers_per_block,
            attention_levels=args.attention_levels,
            batch=args.batch,
            steps=args.steps,
            learning_rate=args.learning_rate,
            precision=args.precision,
            sample_steps=args.sample_steps,
            warmup_steps=args.warmup_steps,
            seed=args.seed,
        )
        if args.synthetic:
            # Every rank writes the same files (deterministic, each renamed into place whole).
            make_sr_dataset(args.data, n=args.synthetic, size=args.size, seed=args.seed)
        images = load_images(args.data, args.size)
        if args.eval_data:
            train_images, eval_images = images, load_images(args.eval_data, args.size, args.eval_images)
        else:
            if len(images) <= args.eval_images:
                raise InvalidConfigError(
                    f"{len(images)} images leave none to train on after {args.eval_images} held out"
                )
            train_images, eval_images = (
                images[: -args.eval_images or None],
                images[len(images) - args.eval_images :],
            )
        report = train(
            settings, train_images, eval_images, dist, log=lambda m: print(m, file=sys.stderr, flush=True)
        )
    except InvalidConfigError as error:
        print(f"invalid configuration: {error}", file=sys.stderr)
        return int(ExitCode.INVALID_CONFIG)
    if dist.is_main and args.out:
        Path(args.out).write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
