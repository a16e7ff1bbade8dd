"""vLLM's own verdict on a launch line: its parser, `create_engine_config()` and the K3 gate.

Runs where vLLM 0.33 is importable (the GPU node). Nothing is loaded onto a GPU: the engine config
is built the way `vllm serve` builds it (no weights, no workers), then the K3 model's gate
`specialized_decode_config(vllm_config)` (vllm/models/kimi_k3/nvidia/specialized_decode/runtime/
__init__.py) is called on it, exactly as the model's `__init__` does.

Outcomes (`VllmVerdict.outcome`):
- `bad_input`: vLLM's argument parser rejects the line (argparse error, exit 2 in `vllm serve`);
- `refused`: building the engine config raises (a refusal before the gate, e.g. DBO on the V2
  runner), or the decode_backend value is not one vLLM accepts;
- `not_ready`: the gate's first failing condition (`reason` is vLLM's string);
- `ready`: the gate passes (the deployment gets the specialized decode);
- `stock`: decode_backend is `auto` (the gate does not run; the stock decode serves).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["VllmVerdict", "vllm_available", "vllm_verdict"]

SUPPORTED_VLLM = "0.33."
_GATE_MODULE = "vllm.models.kimi_k3.nvidia.specialized_decode.runtime"


@dataclass(frozen=True)
class VllmVerdict:
    outcome: str  # bad_input | refused | not_ready | ready | stock
    reason: str | None = None  # the gate's reason (not_ready)
    message: str = ""  # vLLM's own words (error text or the gate's ValueError)


def vllm_available() -> str | None:
    """None when vLLM 0.33 and its K3 gate can be imported here, else why not (one phrase)."""
    import importlib.util

    try:
        if importlib.util.find_spec("vllm") is None:
            return "vLLM is not installed"
        version = _vllm_version()
    except (ImportError, ValueError) as exc:
        return f"vLLM cannot be imported ({exc})"
    if not version.startswith(SUPPORTED_VLLM):
        return f"vLLM {version} is installed; the K3 gate is checked for {SUPPORTED_VLLM}x"
    return None


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        from vllm.version import __version__  # type: ignore[import-not-found]

        return str(__version__)


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `env` applied and every other VLLM_* removed; restored afterwards
    (vLLM reads its variables live, and create_engine_config() itself sets some)."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("VLLM_")]:
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """vLLM logs to stdout; doctor's stdout is its report (or JSON). Capture both streams."""
    captured = io.StringIO()
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    vllm_logger.setLevel(logging.ERROR + 1)
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            yield captured
    finally:
        vllm_logger.setLevel(level)


def _parser() -> object:
    # vllm/entrypoints/cli/main.py:main builds `vllm serve` this way (ServeSubcommand.subparser_init
    # = make_arg_parser on the "serve" subparser); the serve module itself is not imported (it
    # pulls the HTTP server).
    from vllm.entrypoints.common.cli_args import make_arg_parser  # type: ignore[import-not-found]
    from vllm.utils.argparse_utils import (  # type: ignore[import-not-found]
        FlexibleArgumentParser,
    )

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    make_arg_parser(subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]"))
    return parser


def vllm_verdict(serve_args: Sequence[str], env: Mapping[str, str]) -> VllmVerdict:
    """vLLM's verdict on `vllm serve <serve_args>` under `env` (VLLM_* of this process ignored)."""
    with _environment(env), _quiet() as captured:
        return _verdict(list(serve_args), captured)


def _verdict(serve_args: list[str], captured: io.StringIO) -> VllmVerdict:
    from vllm.entrypoints.common.cli_args import (  # type: ignore[import-not-found]
        validate_parsed_serve_args,
    )

    parser = _parser()
    try:
        args = parser.parse_args(["serve", *serve_args])  # type: ignore[attr-defined]
        # ServeSubcommand.cmd: the positional model takes precedence
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        validate_parsed_serve_args(args)
    except SystemExit:
        lines = [ln for ln in captured.getvalue().splitlines() if "error:" in ln]
        return VllmVerdict("bad_input", message=lines[-1] if lines else "argument error")
    except (ValueError, TypeError) as exc:
        return VllmVerdict("bad_input", message=str(exc))

    from vllm.engine.arg_utils import AsyncEngineArgs  # type: ignore[import-not-found]

    try:
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    except Exception as exc:
        return VllmVerdict("refused", message=_one_line(exc))

    gate = sys.modules.get(_GATE_MODULE) or __import__(_GATE_MODULE, fromlist=["_"])
    try:
        decode = gate.specialized_decode_config(config)
    except ValueError as exc:
        message = str(exc)
        prefix = "Kimi K3 specialized decode does not support "
        if message.startswith(prefix):
            return VllmVerdict("not_ready", reason=message[len(prefix) :], message=message)
        return VllmVerdict("refused", message=message)
    if decode is None:
        return VllmVerdict("stock", message="decode_backend auto: the stock decode serves")
    return VllmVerdict("ready")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    # pydantic wraps a config's ValueError: "1 validation error for X\n  Value error, <msg> [..."
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Value error, "):
            return line[len("Value error, ") :].split(" [type=")[0]
        if line.startswith("Assertion failed, "):
            return line[len("Assertion failed, ") :].split(" [type=")[0]
    return text.splitlines()[0] if "validation error" not in text else " ".join(text.split())
