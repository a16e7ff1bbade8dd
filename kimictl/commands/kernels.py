"""`kimictl kernels`: build, install, verify and bench the decode kernels.

Thin: options in, one call into kimictl.kernels, rich or --json out. The DSL, torch and NVML are
imported inside the commands so `kimictl kernels --help` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kimictl.commands._output import console, emit_json, err_console, fits
from kimictl.core.errors import CheckFailed, InputError, Unsupported

app = typer.Typer(
    help="Build, install, verify and bench the decode kernels.",
    no_args_is_help=True,
    add_completion=False,
)

ARCH_HELP = "sm_90a (H100/H200), sm_100a (B200), sm_103a (GB300)."
OUT_HELP = "Output folder (default: kernels-build in kimictl's cache folder, ~/.cache/kimictl)."
STACK_HELP = "Check/install vLLM 0.33.0's pinned kernel stack instead of the kernels."
DRY_HELP = "With --stack: report what would be installed, install nothing."
FROM_HELP = "Folder holding a `kimictl kernels build` output."
NO_BENCH_HELP = "Skip bench (then no dispatch table is written)."
TABLE_FROM_HELP = (
    "A dispatch table or a `kernels bench --json` report (default: this node's installed table)."
)
TABLE_ARCH_HELP = "Which installed table, when this node has several."
VLLM_HELP = (
    "Prebuild vLLM 0.33's own CuTe DSL units for this profile (skinny GEMMs on sm_90a; o-proj and "
    "AttnRes on sm_100a/sm_103a) into the versioned cache the vLLM plugin loads "
    "(KIMICTL_VLLM_PREBUILT)."
)
VLLM_ARCH_HELP = "With --vllm: target arch (default: this node's GPU)."
VLLM_SRC_HELP = "With --vllm: an unpacked vLLM wheel to compile from when vLLM is not importable."
PLAN_ARCH_HELP = "Also list the skinny GEMM units vLLM compiles on this arch (sm_90a derived)."
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]


def _check_arch(arch: str) -> None:
    from kimictl.kernels.toolchain.build import ARCHES  # the arches the build knows: one list

    if arch not in ARCHES:
        raise InputError(f"--arch {arch!r} is not supported; allowed: {', '.join(ARCHES)}")


@app.command()
def build(
    arch: Annotated[str, typer.Option("--arch", help=ARCH_HELP)],
    out: Annotated[Path | None, typer.Option("--out", help=OUT_HELP)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Compile every kernel variant ahead of time (no GPU needed) and export objects + manifest;
    on sm_90a also the fused dense layer (into OUT/layer/sm_90a)."""
    _check_arch(arch)
    from kimictl.kernels.toolchain.build import build as run_build
    from kimictl.kernels.toolchain.build import build_layer, dsl_version

    if dsl_version() is None:
        raise Unsupported(
            "building needs the CuTe DSL compiler, which is not installed",
            hint='pip install "nvidia-cutlass-dsl[cu13]==4.8.0" (or kimictl[build])',
        )

    def progress(i: int, n: int, name: str) -> None:
        if not json_out:
            err_console.print(f"[dim]\\[{i + 1}/{n}] {name}[/dim]", highlight=False)

    result = run_build(arch, out, progress=progress)
    layer = build_layer(arch, out, progress=progress)
    if json_out:
        emit_json(result.to_json() | {"layer": layer.to_json() if layer else None})
        return
    for r in (result, layer):
        if r is not None:
            console.print(
                f"built {len(r.kernels)} kernels for {arch} ({r.reused} reused) in "
                f"{r.seconds:.1f} s -> {r.out_dir}"
            )


@app.command()
def install(
    stack: Annotated[bool, typer.Option("--stack", help=STACK_HELP)] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=DRY_HELP)] = False,
    source: Annotated[Path | None, typer.Option("--from", help=FROM_HELP)] = None,
    no_bench: Annotated[bool, typer.Option("--no-bench", help=NO_BENCH_HELP)] = False,
    vllm_profile: Annotated[str | None, typer.Option("--vllm", help=VLLM_HELP)] = None,
    arch: Annotated[str | None, typer.Option("--arch", help=VLLM_ARCH_HELP)] = None,
    vllm_src: Annotated[Path | None, typer.Option("--vllm-src", help=VLLM_SRC_HELP)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Install the kernels on this GPU node (link, verify, bench, record the dispatch table; the
    fused layer's build too, verified, for the vLLM plugin's layer switch)."""
    if vllm_profile is not None:
        _install_vllm(vllm_profile, arch, vllm_src, json_out=json_out)
        return
    if arch is not None or vllm_src is not None:
        raise InputError("--arch and --vllm-src apply to --vllm PROFILE only")
    if dry_run and not stack:
        raise InputError(
            "--dry-run applies to --stack only; use `kimictl kernels install --stack --dry-run`"
        )
    if stack:
        _install_stack(dry_run=dry_run, json_out=json_out)
        return
    if source is not None and not source.is_dir():
        raise InputError(f"--from {source}: no such folder")
    from kimictl.kernels.toolchain.node import install_kernels

    report = install_kernels(source=source, run_bench=not no_bench)
    if json_out:
        emit_json(report.to_json())
        return
    v = report.verify
    console.print(f"installed {report.arch} kernels to {report.installed_to}")
    console.print(
        f"verify: PASS, {v['checks']} checks, worst relative error {v['worst_rel_err']:.2e}"
    )
    if report.bench_summary:
        console.print(
            f"bench: geomean speedup of dispatched vs cuBLAS "
            f"{report.bench_summary['geomean_speedup_dispatched']:.2f}x; table {report.table_path}"
        )
    console.print(f"layer: {report.layer}")


def _install_vllm(profile: str, arch: str | None, src: Path | None, *, json_out: bool) -> None:
    from kimictl.deployment.profiles import load_profile
    from kimictl.kernels.vllm.prebuilt import install_vllm_units

    spec = load_profile(profile).spec
    if arch is None:
        from kimictl.kernels.toolchain.node import require_gpu

        _, arch = require_gpu("install --vllm (without --arch)")
    _check_arch(arch)

    def progress(i: int, n: int, name: str) -> None:
        if not json_out:
            err_console.print(f"[{i + 1}/{n}] {name}", highlight=False)

    r = install_vllm_units(spec, arch, sources=src, progress=progress)
    if json_out:
        emit_json(r)
    else:
        fams = ", ".join(f"{f} {v['units']}/{v['objects']}" for f, v in r["families"].items())
        console.print(
            f"{r['units']} vLLM units ({r['compiled']} objects, {len(r['failed'])} failed; "
            f"units/objects: {fams or 'none'}) for {arch}, cutlass-dsl {r['cutlass_dsl']}, "
            f"vLLM {r['vllm']}: {r['seconds']:.1f} s, {r['bytes'] / 1e6:.1f} MB -> {r['folder']}",
            highlight=False,
            soft_wrap=True,
        )
        console.print(f"loading: {r['loading']}", highlight=False, soft_wrap=True)
        for fam, why in r["jit"].items():
            console.print(f"stays JIT: {fam}: {why}", highlight=False, soft_wrap=True)
        console.print(
            f"`kimictl serve {profile}` passes it to vLLM ({next(iter(r['env']))}={r['folder']})",
            highlight=False,
            soft_wrap=True,
        )
    if r["failed"]:
        raise CheckFailed(
            f"{len(r['failed'])} unit(s) failed to build: " + ", ".join(r["failed"]),
            hint="vLLM compiles those at start-up as before",
        )


def _install_stack(*, dry_run: bool, json_out: bool) -> None:
    from kimictl.runtime.checks.kernel_stack import install_stack, node_stack_plan

    plan = node_stack_plan()
    if json_out:
        emit_json({"dry_run": dry_run, **plan.to_json()})
    else:
        _render_plan(plan)
    if not plan.driver_ok:
        raise Unsupported(
            f"cannot install the kernel stack: {plan.driver_reason}",
            hint="install an NVIDIA driver supporting CUDA 13 (R580 or newer) on the GPU node",
        )
    if plan.pip_argv is None:
        return
    if dry_run:
        raise CheckFailed(
            f"{sum(p['status'] != 'ok' for p in plan.packages)} kernel-stack package(s) differ "
            "from vLLM 0.33.0's pins",
            hint="run without --dry-run to install them",
        )
    install_stack(plan)
    if not json_out:
        console.print("kernel stack now matches vLLM 0.33.0's pins")


def _render_plan(plan: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    from kimictl.commands._output import print_command

    t = Table(title="vLLM 0.33.0 kernel stack", title_justify="left")
    for col in ("package", "pinned", "installed", "status"):
        t.add_column(col)
    for p in plan.packages:  # a pin like `nvidia-cutlass-dsl[cu13]==4.8.0` is no markup
        style = "green" if p["status"] == "ok" else "red"
        cells = (escape(p["name"]), escape(p["spec"]), escape(p["installed"] or "-"))
        t.add_row(*cells, f"[{style}]{p['status']}[/{style}]")
    console.print(t)
    driver = escape(plan.driver_reason)
    console.print(("driver: " if plan.driver_ok else "[red]driver:[/red] ") + driver)
    if plan.pip_argv:
        print_command("would run: ", list(plan.pip_argv))


@app.command("plan")
def plan_command(
    profile: Annotated[str, typer.Argument(help="Profile name or TOML file.")],
    arch: Annotated[str | None, typer.Option("--arch", help=PLAN_ARCH_HELP)] = None,
    json_out: JsonOpt = False,
) -> None:
    """The CuTe DSL compile units vLLM 0.33.0 builds at start-up for PROFILE (no vLLM needed)."""
    from kimictl.deployment.profiles import load_profile
    from kimictl.kernels.vllm.plan import plan_report

    if arch is not None:
        _check_arch(arch)
    report = plan_report(load_profile(profile).spec, arch=arch)
    if json_out:
        emit_json(report)
        return
    _render_unit_plan(profile, report)


def _render_unit_plan(profile: str, r: dict[str, Any]) -> None:
    from rich.table import Table

    if not r["specialized"] and not r["families"]:
        console.print(
            f"{profile}: decode_backend is not latency_specialized: vLLM builds none of the "
            "specialized decode's CuTe DSL units (stock decode)"
        )
        return
    batches = ", ".join(map(str, r["batches"]))
    t = Table(
        title=f"{profile}: CuTe DSL compile units per rank per start (TP{r['tp']}, DCP "
        f"{r['dcp']}, q {r['q']}, batches {batches})",
        title_justify="left",
    )
    for col in ("family", "vLLM units", "distinct", "duplicates", "kernels", "s/kernel", "vLLM s"):
        t.add_column(col, justify="left" if col == "family" else "right")
    for f in r["families"]:
        per = f.get("seconds_per_kernel")
        per_text = "-" if per is None else f"{per:.2f}" + ("" if f["measured"] else " est.")
        secs = "-" if per is None else f"{f['vllm_seconds']:.0f}"
        t.add_row(
            f["family"], str(f["units"]), str(f["distinct"]), str(f["duplicates"]),
            str(f["kernels"]), per_text, secs,
        )  # fmt: skip
    tot = r["totals"]
    t.add_row(
        "total (lower bound)", str(tot["units"]), str(tot["distinct"]),
        str(tot["units"] - tot["distinct"]), str(tot["kernels"]), "",
        "-" if tot["vllm_seconds"] is None else f"{tot['vllm_seconds']:.0f}",
    )  # fmt: skip
    console.print(t)
    if tot["vllm_seconds"] is not None:
        prov = r["times_provenance"]
        console.print(
            f"expected compile: {tot['vllm_seconds']:.0f} s as vLLM does it, "
            f"{tot['distinct_seconds']:.0f} s de-duplicated (per-kernel times measured on "
            f"{prov.get('machine', '?')} with nvidia-cutlass-dsl {prov.get('cutlass_dsl', '?')}, "
            f"{prov.get('date', '?')}; 'est.' = median of all measured units)",
            highlight=False,
        )
    else:
        console.print("expected compile: unknown (run lab/bench/kernel_compile_times.py)")
    lay = r["layout"]
    if lay["assumed"]:
        console.print(
            f"layout assumed (no K3 config here): {lay['num_layers']} layers, MLA at "
            f"{len(lay['mla_layers'])} of them, AttnRes blocks of {lay['attn_res_block_size']}",
            highlight=False,
        )
    missing = ", ".join(n["family"] for n in r["not_derived"])
    console.print(f"not derived (totals are lower bounds): {missing}", highlight=False)


@app.command()
def verify(json_out: JsonOpt = False) -> None:
    """Prove the installed kernels on this GPU against an fp64 reference (exit 1 on any failure);
    the fused layer's segments too where a layer build exists."""
    from kimictl.kernels.toolchain.build import find_layer_build
    from kimictl.kernels.toolchain.node import open_node_library, require_gpu
    from kimictl.kernels.toolchain.verify import verify as run_verify

    _torch, arch = require_gpu("verify")
    report = run_verify(open_node_library(arch))
    layer_dir = find_layer_build(arch)
    if layer_dir is not None:  # the fused layer's segments, against their fp64 model
        from kimictl.kernels.toolchain.harness import open_library
        from kimictl.kernels.toolchain.verify import verify_layer

        report.checks.extend(verify_layer(open_library(layer_dir)))
    vj = report.to_json()
    if json_out:
        emit_json(vj)
    else:
        _render_verify(vj)
    if not report.ok:
        raise CheckFailed(
            f"{len(vj['failed'])} of {vj['checks']} kernel checks failed on {report.device}"
        )


def _render_verify(vj: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title=f"kernel verify on {vj['device']} ({vj['arch']})", title_justify="left")
    for col in ("kernel", "checks", "worst rel err", "unwritten", "graph == eager", "result"):
        t.add_column(col)
    by: dict[str, list[dict[str, Any]]] = {}
    for c in vj["results"]:
        by.setdefault(c["name"], []).append(c)
    for name, cs in by.items():
        ok = all(c["ok"] for c in cs)
        t.add_row(
            name,
            str(len(cs)),
            f"{max(c['rel_err'] for c in cs):.2e}",
            str(sum(c["unwritten"] for c in cs)),
            "yes" if all(c["graph_identical"] for c in cs) else "NO",
            "[green]PASS[/green]" if ok else "[red]FAIL[/red]",
        )
    console.print(t)
    verdict = "PASS" if vj["ok"] else "FAIL"
    console.print(
        f"{verdict}: {vj['checks']} checks, worst relative error {vj['worst_rel_err']:.2e} "
        f"(limit {vj['rel_tol']:.0e}), shapes N x K {vj['shapes']}"
    )


@app.command()
def bench(json_out: JsonOpt = False) -> None:
    """Time every kernel and cuBLAS on K3's shapes at M = 1..8, 16, 32, 64 (CUDA-graph replay)."""
    from kimictl.kernels.toolchain.bench import bench as run_bench
    from kimictl.kernels.toolchain.node import open_node_library, require_gpu

    _torch, arch = require_gpu("bench")
    report = run_bench(open_node_library(arch))
    # this run's layer chains as a layer record (`kernels layer --from FILE --save` keeps one)
    from kimictl.kernels.toolchain.layer_record import LayerRecord

    doc = report.to_json()
    layer = LayerRecord.from_json(doc) if report.chains else None
    if json_out:
        emit_json(doc | {"layer": layer.to_json() if layer else None})
        return
    _render_bench(report)
    if layer is not None:
        _render_layer(layer)


def _render_bench(report: Any) -> None:
    from rich.table import Table

    s = report.summary()
    t = Table(title=f"decode GEMMs on {report.device}: us per GEMM", title_justify="left")
    for col in (
        "shape",
        "MB",
        "M",
        "cuBLAS us",
        "TB/s",
        "best kimictl us",
        "TB/s",
        "dispatched",
        "x",
    ):
        t.add_column(col, justify="right")
    for p in s["points"]:
        t.add_row(
            p["shape"], f"{p['mb']:.1f}", str(p["m"]), f"{p['cublas_us']:.2f}",
            f"{p['cublas_tbps']:.2f}",
            f"{p['best_kernel_us']:.2f}" if p["best_kernel_tbps"] else "-",
            f"{p['best_kernel_tbps']:.2f}" if p["best_kernel_tbps"] else "-",
            p["dispatched"], f"{p['speedup']:.2f}",
        )  # fmt: skip
    console.print(t)
    console.print(f"geomean speedup, dispatched vs cuBLAS: {s['geomean_speedup_dispatched']:.2f}x")
    for c in report.chains:
        guard = " (guarded: this M goes to cuBLAS)" if c.get("guarded") else ""
        fams = c.get("chosen_families", "all")
        guard += "" if fams == "all" else f" (families kept at this M: {fams})"
        console.print(
            f"layer chain M={c['m']}: cuBLAS {c['cublas_us']:.1f} us, dispatched "
            f"{c['dispatched_us']:.1f} us, x{c['speedup']:.2f}{guard}"
        )


LAYER_FROM_HELP = "A `kernels bench --json` report (default: the record `kernels install` saved)."
LAYER_SAVE_HELP = "With --from: save it as this node's layer record (bench and tune read it)."


@app.command("layer")
def layer_command(
    from_file: Annotated[Path | None, typer.Option("--from", help=LAYER_FROM_HELP)] = None,
    save: Annotated[bool, typer.Option("--save", help=LAYER_SAVE_HELP)] = False,
    json_out: JsonOpt = False,
) -> None:
    """Show the node's layer chains: cuBLAS, vLLM's plan and what the table ships, per M."""
    from kimictl.kernels.toolchain.layer_record import (
        arch_of_device,
        node_layer_record,
        read_layer_record,
        save_layer_record,
    )

    if save and from_file is None:
        raise InputError("--save needs --from FILE (the bench report to record for this node).")
    record = read_layer_record(from_file) if from_file else node_layer_record()
    if record is None:
        raise Unsupported(
            "no layer record on this node.",
            hint="`kimictl kernels install` on the GPU node records one; or "
            "`kimictl kernels layer --from BENCH.json --save` (a `kernels bench --json` report).",
        )
    saved = None
    if save:
        arch = arch_of_device(record.device)
        if arch is None:
            raise InputError(f"{from_file} was measured on {record.device!r}, not a known GPU.")
        saved = save_layer_record(record, arch)
    if json_out:
        emit_json(record.to_json() | {"saved": str(saved) if saved else None})
        return
    _render_layer(record)
    if saved:
        console.print(f"saved as this node's layer record: {saved}")


def _render_layer(record: Any) -> None:
    from rich.table import Table

    from kimictl.kernels.toolchain.layer_record import COPY_CEILING_TBPS

    t = Table(
        title=f"a K3 layer's projections back to back on {record.device}: us per layer (kernels)",
        title_justify="left",
    )
    for col in ("M", "cuBLAS", "vLLM plan", "kimictl", "plan", "of cuBLAS", "x vLLM", "TB/s"):
        t.add_column(col, justify="right")
    for p in record.points:
        t.add_row(
            str(p.m), f"{p.stock_us:.1f} ({p.stock_kernels or '?'})",
            "-" if p.vllm_us is None else f"{p.vllm_us:.1f}",
            f"{p.best_us:.1f} ({p.best_kernels or '?'})", p.best,
            f"{p.vs_stock:.3f}",
            "-" if p.vs_vllm is None else f"{p.vs_vllm:.3f}",
            f"{p.tbps:.2f} ({100 * p.tbps / COPY_CEILING_TBPS:.0f}%)",
        )  # fmt: skip
    console.print(t)


@app.command("table")
def show_table(
    from_file: Annotated[Path | None, typer.Option("--from", help=TABLE_FROM_HELP)] = None,
    arch: Annotated[str | None, typer.Option("--arch", help=TABLE_ARCH_HELP)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show what the dispatch table runs for each K3 shape and M: kimictl kernel or cuBLAS."""
    from kimictl.kernels.toolchain.dispatch import routes
    from kimictl.kernels.toolchain.node import read_dispatch_table

    if arch is not None:
        _check_arch(arch)
    doc = routes(read_dispatch_table(from_file, arch))
    if json_out:
        emit_json(doc)
        return
    _render_routes(doc)


def _render_routes(doc: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table

    from kimictl.kernels.toolchain.dispatch import BENCH_MS, CHAIN_WORDS, family_of

    rows: dict[str, list[str]] = {}
    for p in doc["points"]:
        if p["us"] is None:
            cell = "[dim]-[/dim]"
        elif p["provider"] == "cublas":
            cell = "cuBLAS"
        else:
            cell = f"[green]{p['speedup']:.2f}x[/green]\n{family_of(p['kernel'])}"
        rows.setdefault(p["shape"], [f"{p['shape']}\n[dim]{p['n']}x{p['k']}[/dim]"]).append(cell)

    def table(ms: list[int], part: str = "") -> Table:
        t = Table(
            title=f"dispatch on {doc['device']} ({doc['arch']}, {doc['source']}){part}",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
        )
        t.add_column("shape (N x K)", no_wrap=True)
        for m in ms:
            t.add_column(f"M={m}", justify="right", no_wrap=True)
        for row in rows.values():
            t.add_row(row[0], *(row[1 + BENCH_MS.index(m)] for m in ms))
        return t

    # Too wide for the terminal (e.g. 80 columns): the M columns in as few parts as fit.
    ms = list(BENCH_MS)
    for parts in range(1, len(ms) + 1):
        size = -(-len(ms) // parts)
        chunks = [ms[i : i + size] for i in range(0, len(ms), size)]
        tables = [table(c, f", M {c[0]}-{c[-1]}" if len(chunks) > 1 else "") for c in chunks]
        if all(fits(t) for t in tables):
            break
    for t in tables:
        console.print(t)
    console.print("cell: speedup over cuBLAS, then the kernel family")
    g = doc["geomean_speedup"]
    unmeasured = doc["unmeasured_points"]
    console.print(
        f"kimictl kernels at {doc['kimictl_points']} of {len(doc['points'])} points"
        + (f" ({unmeasured} not measured on this node: cuBLAS)" if unmeasured else "")
        + "; geomean "
        + (f"{g:.2f}x over cuBLAS" if g is not None else "n/a (nothing measured)")
    )
    for m, fams in doc["families_ms"].items():
        console.print(f"M={m}: only {', '.join(fams)} (their layer chain measured faster)")
    by_plan: dict[str, list[str]] = {}
    for m, plan in doc.get("chain_ms", {}).items():
        by_plan.setdefault(plan, []).append(m)
    for plan, ms_ in by_plan.items():
        console.print(
            f"vLLM plugin at M = {', '.join(ms_)}: {CHAIN_WORDS.get(plan, plan)} at every "
            "projection (that whole layer measured fastest)"
        )
    for m, reason in doc["guarded_ms"].items():
        console.print(f"M={m}: all cuBLAS ({reason})")
