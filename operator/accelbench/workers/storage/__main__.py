"""`python -m accelbench.workers.storage`: the serving engines' init container, and a user's copy tool.

    fetch URI --cache DIR      copy gs:// or s3:// into DIR/<scheme>/<bucket>/<prefix> (verified,
                               resumed, reused), print the local path
    upload DIR URI             copy a directory to gs:// or s3://, with its manifest.json last

Exit codes (api.contract.ExitCode): OK; INVALID_CONFIG for a missing, refused or corrupt object and a
full disk (the Job fails at once: retrying cannot help); ERROR otherwise (an unreachable store: the
Job retries). The failure's reason and message go to the termination log as `Reason: message`,
which the operator shows as the run's Failed condition.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ...api.contract import ENV_TERMINATION_LOG, TERMINATION_LOG_PATH, ExitCode
from ..report import error_type, exit_code
from . import default_cache_dir, fetch, upload_dir

TERMINATION_LIMIT = 4096  # what the kubelet keeps of a termination message


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _terminate(exc: BaseException) -> int:
    message = f"{error_type(exc)}: {exc}"
    _log(f"error: {message}")
    path = os.environ.get(ENV_TERMINATION_LOG) or TERMINATION_LOG_PATH
    with contextlib.suppress(OSError):  # no termination log here (a laptop): stderr has it
        Path(path).write_text(message[:TERMINATION_LIMIT])
    return int(exit_code(exc))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelbench.workers.storage", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="copy an object or prefix into the local cache")
    get.add_argument("uri")
    get.add_argument("--cache", type=Path, default=None, help="cache root (default: $ACCELBENCH_CACHE_DIR)")
    put = sub.add_parser("upload", help="copy a directory to an object-store prefix")
    put.add_argument("dir", type=Path)
    put.add_argument("uri")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            fetched = fetch(args.uri, args.cache or default_cache_dir(), log=_log)
            print(fetched.path)
        else:
            upload_dir(args.dir, args.uri, log=_log)
    except Exception as exc:  # every failure ends as a reason and an exit code, never a traceback
        return _terminate(exc)
    return int(ExitCode.OK)


if __name__ == "__main__":
    sys.exit(main())
