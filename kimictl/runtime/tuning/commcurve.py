"""A measured all-reduce curve (lab/bench/allreduce.py JSON) as the model's communication term.

Without a curve the model prices an all-reduce from spec-sheet constants (model.py
`_allreduce_us`: NVLink bandwidth per GPU and an assumed 1 us latency). With one:

- same GPU kind and TP as measured (e.g. an H200 curve at TP2): the measured time for that message
  size, interpolated linearly between measured sizes (the fit below outside them);
- any other TP (TP8/16 from a 2-GPU curve) is EXTRAPOLATED: a least-squares line
  t = a + b x bytes over the measured decode-sized messages (<= 2 MiB) gives the fixed cost a
  (synchronisation + launch inside a CUDA graph) and the per-byte cost b at TP2, which is the
  model's one-shot form with tp = 2; then the model's one-shot (a + (tp-1) b bytes) and two-shot
  (2a + 2 (tp-1)/tp b bytes) forms at the wanted TP, the faster one. `a` is taken as independent of
  TP (more ranks mean more flags to wait for: optimistic at TP8/16);
- another GPU kind (an H200 curve on GB300): b is scaled by the two systems' spec-sheet NVLink
  bandwidth ratio (H200 450 GB/s, GB300 900 GB/s per direction); a is kept as measured.

Which methods count: the stock path may use any (NCCL or symmetric memory: vLLM picks by size),
so the fastest measured one; the specialized path uses torch symmetric memory (multicast two-shot,
which the lent machines may not run), so the fastest measured non-multicast symmetric-memory
method stands in for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kimictl.core.errors import InputError

__all__ = ["CommCurve", "load_comm_curve"]

PathName = Literal["specialized", "stock"]
_SYMM = ("symm_one_shot", "symm_two_shot")
_FIT_MAX_BYTES = 2 << 20


@dataclass(frozen=True)
class CommCurve:
    source: str  # the file it was read from
    gpu: str  # "NVIDIA H200"
    system: str  # kimictl system name of that GPU ("h200")
    world: int  # GPUs measured (the TP the curve holds)
    date: str
    # method -> ((bytes, us), ...) sorted by bytes
    points: tuple[tuple[str, tuple[tuple[int, float], ...]], ...]

    def methods(self, path: PathName) -> list[str]:
        have = [m for m, _ in self.points]
        if path == "specialized":
            symm = [m for m in have if m in _SYMM]
            return symm or have
        return have

    def _best(self, path: PathName) -> list[tuple[int, float]]:
        """The fastest measured method at each size (over the methods `path` may use)."""
        wanted = set(self.methods(path))
        best: dict[int, float] = {}
        for method, pts in self.points:
            if method in wanted:
                for nbytes, us in pts:
                    best[nbytes] = min(us, best.get(nbytes, float("inf")))
        return sorted(best.items())

    def fit(self, path: PathName) -> tuple[float, float]:
        """(a us, b us per byte): least squares of t = a + b bytes over messages <= 2 MiB."""
        pts = [(x, y) for x, y in self._best(path) if x <= _FIT_MAX_BYTES]
        n = len(pts)
        mx = sum(x for x, _ in pts) / n
        my = sum(y for _, y in pts) / n
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        b = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
        b = max(b, 0.0)
        return my - b * mx, b

    def measured_us(self, message_bytes: float, path: PathName) -> float:
        """Time at the measured TP: interpolation between measured sizes, the fit outside."""
        pts = self._best(path)
        if message_bytes < pts[0][0] or message_bytes > pts[-1][0]:
            a, b = self.fit(path)
            return a + b * message_bytes
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            if x0 <= message_bytes <= x1:
                share = 0.0 if x1 == x0 else (message_bytes - x0) / (x1 - x0)
                return y0 + share * (y1 - y0)
        return pts[-1][1]

    def allreduce_us(
        self, tp: int, message_bytes: float, path: PathName, bw_scale: float = 1.0
    ) -> float:
        """One all-reduce over `tp` ranks; bw_scale = curve system's NVLink / target's."""
        if tp <= 1:
            return 0.0
        if tp == self.world and bw_scale == 1.0:
            return self.measured_us(message_bytes, path)
        a, b = self.fit(path)
        b *= bw_scale
        one_shot = a + (tp - 1) * b * message_bytes
        two_shot = 2 * a + 2 * (tp - 1) / tp * b * message_bytes
        return min(one_shot, two_shot)

    def describe(self, target_system: str, tp: int | None = None) -> str:
        how = f"measured all-reduce curve {self.source} ({self.gpu} x{self.world}, {self.date})"
        notes = []
        if tp is None or tp != self.world:
            notes.append(f"TP other than {self.world} extrapolated from TP{self.world}")
        if target_system != self.system:
            notes.append(
                f"bandwidth term scaled from {self.system} to {target_system} by the spec-sheet "
                "NVLink ratio"
            )
        return how + (": " + "; ".join(notes) if notes else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "gpu": self.gpu,
            "system": self.system,
            "world": self.world,
            "date": self.date,
            "methods": [m for m, _ in self.points],
            "fit_specialized_us": [round(v, 6) for v in self.fit("specialized")],
            "fit_stock_us": [round(v, 6) for v in self.fit("stock")],
        }


def load_comm_curve(path: str | Path) -> CommCurve:
    """Read a lab/bench/allreduce.py result; InputError (one sentence) for anything else."""
    from kimictl.runtime.tuning.systems import SYSTEMS, system_for_gpu_name

    p = Path(path)
    flag = f"--comm-curve {p}"
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{flag}: no such file.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{flag}: not a readable JSON file ({type(error).__name__}).") from None
    try:
        machine = raw["machine"]
        gpus = list(machine["gpus"])
        world = int(machine["world"])
        rows = list(raw["rows"])
    except (KeyError, TypeError, ValueError):
        raise InputError(
            f"{flag}: not an all-reduce curve (needs machine.gpus, machine.world and rows).",
            hint="pass a file written by lab/bench/allreduce.py",
        ) from None
    if world < 2 or not gpus:
        raise InputError(f"{flag}: the curve was measured on {world} GPU(s); it needs 2 or more.")
    per_method: dict[str, dict[int, float]] = {}
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("us"), (int, float)):
            continue  # a size a method could not run
        try:
            nbytes, us, method = int(row["bytes"]), float(row["us"]), str(row["method"])
        except (KeyError, TypeError, ValueError):
            continue
        if nbytes > 0 and us > 0:
            per_method.setdefault(method, {})[nbytes] = us
    usable = {m: v for m, v in per_method.items() if len(v) >= 2}
    if not usable:
        raise InputError(f"{flag}: no method has two or more measured sizes.")
    name = str(gpus[0])
    system = system_for_gpu_name(name)
    if system is None:
        raise InputError(
            f"{flag}: measured on {name}, which is not a system the model describes; allowed: "
            f"{', '.join(SYSTEMS)}."
        )
    points = tuple(
        (m, tuple(sorted(v.items()))) for m, v in sorted(usable.items(), key=lambda kv: kv[0])
    )
    return CommCurve(
        source=str(p),
        gpu=name,
        system=system,
        world=world,
        date=str(raw.get("date", "undated")),
        points=points,
    )
