"""Quantize a Hugging Face model per layer under an effective-bits budget; write the export and its report.

    python -m accelbench.workers.quantize --model DIR --data TEXT.jsonl --out DIR --budget-bits 4.5

The report (quantization-report.json in --out, and --report when given) holds the per-layer
sensitivity table. Exit codes: 0 done, ExitCode.INVALID_CONFIG for inputs that cannot work.
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
from .run import DEFAULT_FORMATS, QuantizeSettings, quantize_model


def main(argv: Sequence[str] | None = None) -> int:
    defaults = QuantizeSettings()
    parser = argparse.ArgumentParser(
        prog="python -m accelbench.workers.quantize", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--model", required=True, type=Path, help="Hugging Face model directory (bf16 or fp32)"
    )
    parser.add_argument("--data", required=True, type=Path, help="JSONL: chat messages or prompt/completion")
    parser.add_argument("--out", required=True, type=Path, help="directory for the quantized model")
    parser.add_argument("--report", type=Path, help="also write the report here")
    parser.add_argument("--budget-bits", type=float, default=defaults.budget_bits)
    parser.add_argument("--formats", default=",".join(DEFAULT_FORMATS))
    parser.add_argument("--seq", type=int, default=defaults.seq)
    parser.add_argument("--calibration", type=int, default=defaults.calibration, help="calibration windows")
    parser.add_argument("--held-out", type=int, default=defaults.held_out, help="held-out windows")
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument(
        "--family", default=defaults.family, help="chat template family when the model has none"
    )
    args = parser.parse_args(argv)
    settings = QuantizeSettings(
        budget_bits=args.budget_bits,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        seq=args.seq,
        calibration=args.calibration,
        held_out=args.held_out,
        batch=args.batch,
        family=args.family,
    )
    try:
        report = quantize_model(
            args.model, args.data, args.out, settings, log=lambda m: print(m, file=sys.stderr)
        )
    except InvalidConfigError as error:
        print(f"invalid configuration: {error}", file=sys.stderr)
        return int(ExitCode.INVALID_CONFIG)
    if args.report:
        args.report.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
