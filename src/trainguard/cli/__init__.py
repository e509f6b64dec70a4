"""The `trainguard` command: argument parsing and exit codes only."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from typing import NoReturn

from trainguard import __version__
from trainguard.cli.ckpt import add_ckpt_command
from trainguard.cli.diagnose import add_diagnose_command
from trainguard.cli.logs import add_logs_command
from trainguard.cli.ops import add_ops_commands
from trainguard.cli.read import add_read_commands
from trainguard.cli.report import add_report_commands
from trainguard.cli.run import add_run_command
from trainguard.cli.ui import add_ui_command
from trainguard.errors import TrainguardError
from trainguard.exitcodes import ExitCode

_CHOICE = re.compile(r"argument (\S+): invalid choice: (.*?) \(choose from (.*)\)")
_FIXED = re.compile(r"argument (\S+): (.*\. Fix: .*)")


class Parser(argparse.ArgumentParser):
    """Bad flags are one line that says the fix, as trainguard's own errors are, not the
    whole usage (45 lines for `run`). Subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        m = _CHOICE.fullmatch(message)
        fixed = _FIXED.fullmatch(message)
        if m:
            flag, got, valid = m.group(1).split("/")[0], m.group(2), m.group(3).replace("'", "")
            message = f"{flag}: {got} is not a valid choice. Fix: pass one of {valid}"
        elif fixed:  # an argument type's message that says the fix (cli/args)
            message = f"{fixed.group(1).split('/')[0]}: {fixed.group(2)}"
        else:
            message += f". Fix: see `{self.prog} --help`"
        self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = Parser(  # its subcommands are Parsers too
        prog="trainguard",
        description="Keeps distributed PyTorch training jobs alive: a torchrun-compatible "
                    "launcher with auto restart, events and recovery records.")
    p.add_argument("--version", action="version", version=f"trainguard {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    add_run_command(sub)
    add_read_commands(sub)
    add_ops_commands(sub)
    add_logs_command(sub)
    add_report_commands(sub)
    add_ckpt_command(sub)
    add_diagnose_command(sub)
    add_ui_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    ns = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if ns.verbose else logging.WARNING,
                        format="[trainguard] %(levelname)s %(name)s: %(message)s")
    if not hasattr(ns, "func"):
        p.print_help(sys.stderr)
        return int(ExitCode.USAGE)
    try:
        code = int(ns.func(ns))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except TrainguardError as e:
        print(f"trainguard: error: {e}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except BrokenPipeError:
        return _output_closed()


def _output_closed() -> int:
    """stdout's reader went away (`trainguard events JOB | head`): end quietly, as `git log`
    does. What is still buffered goes to /dev/null so that Python's own flush at exit
    finds nothing to complain about (Python docs, signal module, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return int(ExitCode.OUTPUT_CLOSED)
