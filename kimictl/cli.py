"""The kimictl root command.

Commands are listed in one table and imported only when invoked. `kimictl`, `kimictl --help` and
`kimictl --version` are answered from the table without importing Typer at all (it is most of the
start-up time); any other invocation builds the Typer root and imports just the command named.
Errors are printed here and nowhere else: a `KimictlError` becomes `error:`/`hint:` lines on stderr
and its exit code.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any

from kimictl import __version__
from kimictl.core.errors import KimictlError

__all__ = ["COMMANDS", "main", "root_help"]

ABOUT = "kimictl: deploy, tune and prove Kimi K3's latency-specialized decode path on vLLM."
ROOT_OPTIONS = [
    ("--debug", "Show tracebacks for unexpected errors."),
    ("--version", "Show the version and exit."),
    ("-h, --help", "Show this message and exit."),
]

# name -> (module, attribute holding a typer.Typer, one-line help). Order is the help order.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("kimictl.commands.demo", "app", "The main job on the CPU default: tune, A/B."),
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


def root_help() -> str:
    """The root help page, built from the tables above (Typer's root uses it too)."""
    width = max(len(name) for name in [*COMMANDS, *(o for o, _ in ROOT_OPTIONS)]) + 2
    lines = ["Usage: kimictl [OPTIONS] COMMAND [ARGS]...", "", f"  {ABOUT}", "", "Options:"]
    lines += [f"  {opt:<{width}}{text}" for opt, text in ROOT_OPTIONS]
    lines += ["", "Commands:"]
    lines += [f"  {name:<{width}}{entry[2]}" for name, entry in COMMANDS.items()]
    return "\n".join(lines) + "\n"


def _plain_switches(command: Any) -> None:
    """A switch takes no value: typer's help would show it a `<bool>` type, as if it took one.
    A bounded number's range moves from the type column to its help."""
    for param in getattr(command, "params", ()):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        # a min=/max= range reads in the help column: in the type column it squeezes the names
        bounds = getattr(param, "_get_number_range_help_str", None)
        text = bounds() if bounds is not None else None
        if text:
            param.help = f"{param.help or ''} Allowed: {text}.".lstrip()
            param._get_number_range_help_str = lambda: None
    make_help = command.get_help_option  # --help is built when help is shown

    def help_option(ctx: Any) -> Any:
        option = make_help(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _plain_switches(sub)


def _build_root() -> Any:
    import typer
    import typer.main
    from typer.core import TyperGroup

    class LazyGroup(TyperGroup):
        def list_commands(self, ctx: Any) -> list[str]:
            return list(COMMANDS)

        def get_command(self, ctx: Any, cmd_name: str) -> Any:
            entry = COMMANDS.get(cmd_name)
            if entry is None:
                return None
            module_name, attr, _ = entry
            command = typer.main.get_command(getattr(importlib.import_module(module_name), attr))
            command.name = cmd_name
            _plain_switches(command)
            return command

        def format_help(self, ctx: Any, formatter: Any) -> None:
            formatter.write(root_help())

    app = typer.Typer(
        cls=LazyGroup,
        rich_markup_mode=None,
        add_completion=False,
        context_settings={"help_option_names": ["-h", "--help"]},
        help=ABOUT,
    )

    @app.callback()
    def _root(
        debug: bool = typer.Option(False, "--debug", help=ROOT_OPTIONS[0][1]),
    ) -> None:
        pass

    return typer.main.get_command(app)


def _print_error(error: KimictlError) -> None:
    sys.stderr.write(f"error: {error.message}\n")
    if error.hint:
        sys.stderr.write(f"hint: {error.hint}\n")


def _usage_error(error: Any) -> KimictlError:
    """Click's usage errors (bad value, unknown option or command, missing argument) as one
    `error:` sentence and a hint naming the help page, instead of click's Usage:/Error: block."""
    from kimictl.core.errors import InputError

    message = " ".join(str(error.format_message()).split())
    # Typer validates values with pydantic; its error carries the value the user typed.
    cause = error.__cause__
    errors = cause.errors() if cause is not None and hasattr(cause, "errors") else []
    if errors and "input" in errors[0] and message.startswith("Invalid value for "):
        where, _, why = message[len("Invalid value for ") :].partition(": ")
        message = _bound_or_choice(error, errors[0]) or (
            f"{where} got {errors[0]['input']!r}: {why[:1].lower()}{why[1:]}"
        )
    elif message:
        message = message[:1].lower() + message[1:]
    ctx = getattr(error, "ctx", None)
    path = ctx.command_path if ctx is not None else "kimictl"
    return InputError(message.rstrip("."), hint=f"'{path} -h' lists the commands and options")


def _bound_or_choice(error: Any, detail: dict[str, Any]) -> str | None:
    """A value outside an option's `min=`/`max=` or its enum, said as the commands say it:
    `--repeat 0 must be >= 1`, `--traces-port 0 is out of range: allowed 1 to 65535`,
    `--workload 'bogus' is not one of: random, agentic`."""
    param = getattr(error, "param", None)
    opts = getattr(param, "opts", None)
    if not opts:
        return None
    flag, value, kind = opts[0], detail["input"], detail.get("type")
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if kind in ("greater_than_equal", "less_than_equal"):
        if low is not None and high is not None:
            return f"{flag} {value} is out of range: allowed {low} to {high}"
        return f"{flag} {value} must be " + (f">= {low}" if low is not None else f"<= {high}")
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    choices = getattr(annotation, "__members__", None)
    if kind == "value_error" and choices:
        allowed = ", ".join(str(c.value) for c in choices.values())
        return f"{flag} {value!r} is not one of: {allowed}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args in ([], ["-h"], ["--help"]):
        sys.stdout.write(root_help())
        return 0
    if args == ["--version"]:
        sys.stdout.write(f"kimictl {__version__}\n")
        return 0
    debug = "--debug" in args
    # Typer 0.29 vendors its own click: its exceptions are the ones commands raise.
    import typer
    from typer._click import exceptions

    try:
        result: Any = _build_root().main(args=args, prog_name="kimictl", standalone_mode=False)
    except KimictlError as error:
        _print_error(error)
        return error.exit_code
    except exceptions.NoArgsIsHelpError as error:  # a group called bare: its help page
        error.show()
        return 2
    except exceptions.UsageError as error:
        _print_error(_usage_error(error))
        return 2
    except exceptions.ClickException as error:
        message = " ".join(str(error.format_message()).split())
        sys.stderr.write(f"error: {message}\n")
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
