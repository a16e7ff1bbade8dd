"""Pareto plots of a search: a terminal one (plotext) and a PNG (matplotlib, imported lazily)."""

from __future__ import annotations

from pathlib import Path

from kimictl.core.errors import InputError
from kimictl.runtime.tuning.search import SearchResult, pareto_front

__all__ = ["check_png_target", "save_png", "terminal_plot"]


def _fronts(result: SearchResult) -> dict[str, list[tuple[float, float]]]:
    fronts: dict[str, list[tuple[float, float]]] = {}
    for path in ("specialized", "stock"):
        rows = [p for p in result.candidates if p.config.path == path and p.fits_memory]
        if rows:
            fronts[path] = [
                (p.tokens_per_s_per_user, p.tokens_per_s_per_gpu) for p in pareto_front(rows)
            ]
    return fronts


def terminal_plot(result: SearchResult, *, width: int = 80, height: int = 20) -> str:
    """The specialized and stock Pareto frontiers as plain text (tokens/s/GPU vs tokens/s/user)."""
    import plotext as plt

    fig = plt.figure
    fig.clear()
    fig.plot_size(width, height)
    markers = {"specialized": "dot", "stock": "+"}
    for path, points in _fronts(result).items():
        xs, ys = zip(*sorted(points), strict=True)
        fig.draw(fig.signal(list(xs), list(ys), marker=markers[path]).lines().label(path))
    if result.choice is not None:
        chosen = result.choice.prediction
        point = fig.signal(
            [chosen.tokens_per_s_per_user], [chosen.tokens_per_s_per_gpu], marker="x"
        )
        fig.draw(point.label("choice"))
    fig.title(f"Pareto frontier (model), {result.inputs.system.name} x {result.inputs.gpus}")
    fig.label("x: tokens/s/user", axis="x")
    fig.label("y: tokens/s/GPU", axis="y")
    text = str(plt.uncolorize(str(fig.build())))
    fig.clear()
    return text


def check_png_target(path: str | Path, *, overwrite: bool = False) -> Path:
    """A .png in an existing folder, not a folder, and not an existing file unless `overwrite`."""
    from kimictl.core.outputs import check_new_file

    return check_new_file(path, flag="--plot", suffix=".png", overwrite=overwrite)


def save_png(result: SearchResult, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the frontiers to a PNG; InputError for a bad target (see check_png_target) or when
    matplotlib is missing."""
    target = check_png_target(path, overwrite=overwrite)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as mpl
    except ImportError as exc:
        raise InputError(
            "--plot needs matplotlib, which is not installed.",
            hint="pip install matplotlib",
        ) from exc
    fig, ax = mpl.subplots(figsize=(7, 4.5))
    for name, points in _fronts(result).items():
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, marker="o", label=f"{name} (model)")
    if result.choice is not None:
        chosen = result.choice.prediction
        ax.scatter(
            [chosen.tokens_per_s_per_user],
            [chosen.tokens_per_s_per_gpu],
            marker="*",
            s=200,
            color="red",
            label="choice",
            zorder=3,
        )
    ax.set_xlabel("tokens/s/user")
    ax.set_ylabel("tokens/s/GPU")
    ax.set_title(
        f"K3 decode, {result.inputs.system.name} x {result.inputs.gpus}, "
        f"context {result.inputs.context}"
    )
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(target, dpi=120)
    mpl.close(fig)
    return target
