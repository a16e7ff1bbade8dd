"""The kimictl root command.

Commands are listed in one table and imported only when invoked, so `kimictl --help` imports no
command module (and never torch, vllm, cutlass, pynvml or textual). Errors are printed here and
nowhere else: a `KimictlError` becomes `error:`/`hint:` lines on stderr and its exit code.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any

import typer

# Typer 0.29 vendors its own click; errors are caught through the same copy its commands raise.
from typer._click import core, exceptions, formatting
from typer.core import TyperGroup

from kimictl import __version__
from kimictl.runtime.errors import KimictlError

# name -> (module, attribute holding a typer.Typer, one-line help). Order is the help order.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "doctor": (
        "kimictl.commands.doctor",
        "app",
        "Check GPUs, fabric, stack and flags against the K3 fast path.",
    ),
    "kernels": (
        "kimictl.commands.kernels",
        "app",
        "Build, install, verify and bench the decode kernels.",
    ),
    "tune": (
        "kimictl.commands.tune",
        "app",
        "Pick TP/DCP/draft/batch profiles from a model or measurements.",
    ),
    "profiles": (
        "kimictl.commands.profiles",
        "app",
        "List, show, validate and diff deployment profiles.",
    ),
    "serve": (
        "kimictl.commands.serve",
        "app",
        "Launch vLLM with a profile (one node, many, or an A/B pair).",
    ),
    "ps": ("kimictl.commands.runs", "ps_app", "List servers kimictl launched."),
    "stop": ("kimictl.commands.runs", "stop_app", "Stop servers kimictl launched."),
    "logs": ("kimictl.commands.runs", "logs_app", "Show a launched server's log."),
    "setup": (
        "kimictl.commands.setup",
        "app",
        "Prepare local runtimes (the CPU vLLM for the embedded demo).",
    ),
    "bench": (
        "kimictl.commands.bench",
        "app",
        "Load-test endpoints: throughput, latency, interactivity, A/B.",
    ),
    "monitor": (
        "kimictl.commands.monitor",
        "app",
        "Live TUI of throughput and interactivity, tuned vs stock.",
    ),
    "validate": (
        "kimictl.commands.validate",
        "app",
        "Correctness gate: candidate vs reference endpoint.",
    ),
}


class _LazyGroup(TyperGroup):
    def list_commands(self, ctx: core.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: core.Context, cmd_name: str) -> core.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        import typer.main

        module_name, attr, _ = entry
        app = getattr(importlib.import_module(module_name), attr)
        command = typer.main.get_command(app)
        command.name = cmd_name
        return command

    def format_commands(self, ctx: core.Context, formatter: formatting.HelpFormatter) -> None:
        # Help text from the table: listing commands must not import them.
        with formatter.section("Commands"):
            formatter.write_dl([(name, entry[2]) for name, entry in COMMANDS.items()])


_app = typer.Typer(
    cls=_LazyGroup,
    rich_markup_mode=None,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="kimictl: deploy, tune and prove Kimi K3's latency-specialized decode path on vLLM.",
)


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"kimictl {__version__}\n")
        raise typer.Exit(0)


@_app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for unexpected errors."),
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    pass


def _print_error(error: KimictlError) -> None:
    sys.stderr.write(f"error: {error.message}\n")
    if error.hint:
        sys.stderr.write(f"hint: {error.hint}\n")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        root = typer.main.get_command(_app)
        result: Any = root.main(args=args, prog_name="kimictl", standalone_mode=False)
    except KimictlError as error:
        _print_error(error)
        return error.exit_code
    except exceptions.NoArgsIsHelpError as error:
        error.show()
        return 2
    except exceptions.UsageError as error:
        error.show()
        return 2
    except exceptions.ClickException as error:
        error.show()
        return error.exit_code
    except typer.Exit as error:
        return int(error.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return 130
    except Exception as error:  # the one place an unexpected error is turned into a line
        sys.stderr.write(f"kimictl bug: {type(error).__name__}: {error}\n")
        if debug:
            traceback.print_exc()
        else:
            sys.stderr.write("hint: re-run with --debug for the traceback and report it\n")
        return 3
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
