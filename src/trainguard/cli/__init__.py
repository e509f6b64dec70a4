"""The `trainguard` command: argument parsing and exit codes only."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from trainguard import __version__
from trainguard.cli.ckpt import add_ckpt_command
from trainguard.cli.diagnose import add_diagnose_command
from trainguard.cli.fmt import complain
from trainguard.cli.logs import add_logs_command
from trainguard.cli.ops import add_ops_commands
from trainguard.cli.read import add_read_commands
from trainguard.cli.report import add_report_commands
from trainguard.cli.run import add_run_command
from trainguard.cli.ui import add_ui_command
from trainguard.errors import TrainguardError
from trainguard.exitcodes import ExitCode
from trainguard.suggest import closest, instead

_CHOICE = re.compile(r"argument (\S+): invalid choice: (.*?) \(choose from (.*)\)")
_FIXED = re.compile(r"argument (\S+): (.*\. Fix: .*)")


class Parser(argparse.ArgumentParser):
    """Bad flags are one line that says the fix, as trainguard's own errors are, not the
    whole usage (45 lines for `run`). Subcommands' parsers are of this class too."""

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """Unknown arguments are refused by the subcommand they were given to, with the
        closest of its flags (`--max-restart`: did you mean --max-restarts?) and its help."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            target = _subcommand(self, ns)
            flags = [a.split("=", 1)[0] for a in extras if a.startswith("-")]
            other = [f"{f}: {instead(f)}" for f in flags if instead(f)]
            close = [c for c in (closest_flag(target, f) for f in flags if not instead(f)) if c]
            see = f"`{target.prog} --help`"
            fix = "; ".join([*other, f"did you mean {' / '.join(close)}? See {see}" if close
                             else f"see {see}"])
            target.exit(int(ExitCode.USAGE), f"{target.prog}: error: unrecognized arguments: "
                        f"{' '.join(extras)}. Fix: {fix}\n")
        return ns

    def error(self, message: str) -> NoReturn:
        m = _CHOICE.fullmatch(message)
        fixed = _FIXED.fullmatch(message)
        if m:
            flag, got, valid = m.group(1).split("/")[0], m.group(2), m.group(3).replace("'", "")
            choices = [c.strip() for c in valid.split(",")]
            near = closest(got.strip("'"), {c: () for c in choices})
            meant = f"did you mean {near}? Or pass" if near else "pass"
            message = f"{flag}: {got} is not a valid choice. Fix: {meant} one of {valid}"
        elif fixed:  # an argument type's message that says the fix (cli/args)
            message = f"{fixed.group(1).split('/')[0]}: {fixed.group(2)}"
        elif message.startswith("argument --restart-args") and "expected one argument" in \
                message:  # `--restart-args --init_from=resume`: a value that looks a flag
            message = ("--restart-args: expected its value, one string. Fix: join it with '=' "
                       "and quote it: --restart-args='--init_from=resume'")
        else:
            message += f". Fix: see `{self.prog} --help`"
        self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {message}\n")


def _subcommand(p: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub)command parser `ns` was parsed by (`trainguard ckpt ls`)."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(ns, action.dest, None) or "")
            if isinstance(chosen, argparse.ArgumentParser):
                return _subcommand(chosen, ns)
    return p


def closest_flag(p: argparse.ArgumentParser, flag: str) -> str | None:
    """The flag of `p` that `flag` most likely meant (suggest.closest), in its dash form."""
    if not flag.startswith("--"):
        return None
    long = {next(s for s in a.option_strings if s.startswith("--")): a.option_strings
            for a in p._actions if any(s.startswith("--") for s in a.option_strings)}
    return closest(flag, long)


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
    except TrainguardError as e:  # `trainguard run: error:`, as argparse's own errors read
        complain(ns.command, str(e))
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
