"""The ``varstore`` command: inspect, check, measure, build and combine stores from a shell.

Exit codes: 0 success, 1 a check failed or a store/file could not be read or
written, 2 a usage error, 130 interrupted. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from .._version import __version__
from ..errors import FAILURE_EXIT_CODE, USAGE_EXIT_CODE, CommandError, RecordIndexError, VarstoreError
from . import convert, cp, dump, importing, info, merge, repair, stats, verify
from .dump import join_negative_range
from .output import discard_standard_output, one_line, writing_to_standard_output

_INTERRUPTED_EXIT_CODE = 130
_BROKEN_PIPE_EXIT_CODE = 141
_COMMANDS = (info, dump, verify, repair, stats, convert, importing, merge, cp)


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr, like every other error (``--help`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT_CODE, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="varstore",
        description="Inspect, check and build varstore shards and datasets.",
        epilog="Run 'varstore COMMAND --help' for the options of each command.",
    )
    parser.add_argument("--version", action="version", version=f"varstore {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in _COMMANDS:
        command.add_parser(commands)
    for subparser in commands.choices.values():
        subparser.set_defaults(parser=subparser)  # so that main reports unknown arguments as this command's
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line with `argv` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(join_negative_range(sys.argv[1:] if argv is None else argv))
        if unknown:
            args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as exit:  # argparse has printed the usage error or the help
        return exit.code if isinstance(exit.code, int) else USAGE_EXIT_CODE
    prefix = f"varstore {args.command}: "
    try:
        code = args.run(args)
        with writing_to_standard_output():
            sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader of our output went away (`varstore dump ... | head`): stop quietly.
        discard_standard_output()
        return _BROKEN_PIPE_EXIT_CODE
    except KeyboardInterrupt:
        print(f"{prefix}interrupted", file=sys.stderr)
        return _INTERRUPTED_EXIT_CODE
    except CommandError as error:
        print(prefix + one_line(error), file=sys.stderr)
        return error.exit_code
    except RecordIndexError as error:
        print(prefix + one_line(error), file=sys.stderr)
        return USAGE_EXIT_CODE
    except (VarstoreError, OSError) as error:
        print(prefix + one_line(error), file=sys.stderr)
        return FAILURE_EXIT_CODE
    except MemoryError:
        # The sources report the file and record they were reading; this catches what no source could foresee.
        print(f"{prefix}out of memory", file=sys.stderr)
        return FAILURE_EXIT_CODE
