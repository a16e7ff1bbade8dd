"""Workloads: what requests to send, independent of how fast (that is loadgen's job).

A workload yields `Session`s. A session is a list of steps run one after another: a `RequestSpec`
(one request) or a `FanOut` (sub-sessions run concurrently, the parent waits for all), each with a
think time before it. `random` and `prompts` yield one-request sessions; `agentic` yields multi-turn
sessions; `replay` yields one-request sessions stamped with their arrival time `at`.

Everything is drawn from `random.Random(seed)`, so the same seed gives the same requests in the
same order: an A/B sends the identical sequence to both sides.

Prompts are lists of token ids for /v1/completions (exact input lengths without a tokenizer, and
shared prefixes are shared token for token, so prefix caching sees them), or text for chat and for
the `prompts` workload. Ids are drawn from [TOKEN_LO, TOKEN_HI), valid in any vocabulary of at least
2048 tokens (the CPU demo's tiny model has exactly 2048; Kimi K3 has 163840).

Length distributions (`parse_length`): `N` fixed; `A:B` or `uniform:A:B` uniform integers in [A, B];
`lognormal:MEDIAN:SIGMA` (log-space sigma), clamped to [1, 16 x MEDIAN].
"""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

import orjson

from kimictl.core.errors import InputError

__all__ = [
    "AGENTIC_PRESETS",
    "AgenticConfig",
    "AgenticWorkload",
    "FanOut",
    "LengthDist",
    "PromptsWorkload",
    "RandomWorkload",
    "ReplayWorkload",
    "RequestSpec",
    "TOKEN_HI",
    "TOKEN_LO",
    "Session",
    "Workload",
    "load_agentic_config",
    "parse_length",
    "prompt_text",
]

TOKEN_LO = 100
TOKEN_HI = 2000

# A small fixed vocabulary to render token ids as text for chat endpoints (about one token a word).
_WORDS = (
    "the of and to in is it that for on with as was at by be this are from or have an they which "
    "one you were her all she there would their we him been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then "
    "do first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three"
).split()


@dataclass(frozen=True)
class LengthDist:
    kind: str  # fixed | uniform | lognormal
    a: float
    b: float = 0.0

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        value = rng.lognormvariate(math.log(self.a), self.b)
        return max(1, min(int(round(value)), int(16 * self.a)))

    @property
    def mean(self) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return self.a * math.exp(self.b * self.b / 2)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}:{int(self.b)}"
        return f"lognormal:{self.a:g}:{self.b:g}"


def parse_length(text: str | int | float, *, what: str = "length") -> LengthDist:
    """`256` | `128:512` | `uniform:128:512` | `lognormal:256:0.6` (median, log-sigma)."""
    allowed = "N, A:B, uniform:A:B or lognormal:MEDIAN:SIGMA"
    if isinstance(text, int | float) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        raise InputError(f"{what} {text!r} is not one of {allowed}")
    parts = [p.strip() for p in text.strip().split(":")]
    try:
        if len(parts) == 1:
            n = float(parts[0])
            dist = LengthDist("fixed", n)
            ok = n >= 1 and n == int(n)
        elif parts[0] == "lognormal" and len(parts) == 3:
            dist = LengthDist("lognormal", float(parts[1]), float(parts[2]))
            ok = dist.a >= 1 and dist.b >= 0
        else:
            if parts[0] == "uniform":
                parts = parts[1:]
            if len(parts) != 2:
                raise ValueError
            lo, hi = float(parts[0]), float(parts[1])
            dist = LengthDist("uniform", lo, hi)
            ok = 1 <= lo <= hi and lo == int(lo) and hi == int(hi)
    except ValueError:
        raise InputError(f"{what} {text!r} is not one of {allowed}") from None
    if not ok:
        raise InputError(
            f"{what} {text!r} must use whole numbers >= 1 (lognormal: median >= 1, sigma >= 0)"
        )
    return dist


@dataclass(frozen=True)
class RequestSpec:
    """One request: the prompt (token ids or text), its length in tokens and max output tokens."""

    prompt: list[int] | str | None
    input_len: int
    output_len: int
    think_time: float = 0.0


@dataclass(frozen=True)
class FanOut:
    """Sub-agents: sessions that run concurrently; the parent continues when all are done."""

    sessions: list[Session]
    think_time: float = 0.0


@dataclass(frozen=True)
class Session:
    id: int
    steps: list[RequestSpec | FanOut]
    at: float | None = None  # replay: seconds from the trace's start

    @property
    def num_requests(self) -> int:
        n = 0
        for s in self.steps:
            n += sum(x.num_requests for x in s.sessions) if isinstance(s, FanOut) else 1
        return n


class Workload(Protocol):
    @property
    def name(self) -> str: ...

    def sessions(self, seed: int) -> Iterator[Session]: ...

    def describe(self) -> dict[str, Any]: ...


def prompt_text(spec: RequestSpec) -> str:
    """The prompt as text (chat endpoints): ids become words from a fixed list."""
    if isinstance(spec.prompt, str):
        return spec.prompt
    ids = spec.prompt or []
    n = len(_WORDS)
    return " ".join(_WORDS[i % n] for i in ids)


def _ids(rng: random.Random, n: int) -> list[int]:
    r = rng.randrange
    return [r(TOKEN_LO, TOKEN_HI) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# random


@dataclass(frozen=True)
class RandomWorkload:
    """Independent requests with seeded random token prompts (no shared prefix unless asked)."""

    input_len: LengthDist
    output_len: LengthDist
    prefix_len: int = 0
    name: str = "random"

    def sessions(self, seed: int) -> Iterator[Session]:
        rng = random.Random(f"random/{seed}")
        prefix = _ids(random.Random(f"prefix/{seed}"), self.prefix_len)
        i = 0
        while True:
            n_in = self.input_len.sample(rng)
            n_out = self.output_len.sample(rng)
            ids = prefix + _ids(rng, n_in)
            yield Session(i, [RequestSpec(ids, len(ids), n_out)])
            i += 1

    def describe(self) -> dict[str, Any]:
        return {
            "workload": self.name,
            "input_len": str(self.input_len),
            "output_len": str(self.output_len),
            "prefix_len": self.prefix_len,
        }


# ---------------------------------------------------------------------------------------------
# agentic


@dataclass(frozen=True)
class AgenticConfig:
    """The shape of an agentic-coding session (AgentX-like). Lengths in tokens, times in seconds.

    A session starts from `system_prompt_len` tokens shared by every session (system prompt and tool
    schemas) plus a user task of `task_len`. Each turn sends the whole context and asks for
    `output_len` tokens (mostly short tool calls); the context then grows by that output (synthetic,
    the same tokens for every target) and by a tool result of `tool_result_len`, after a tool
    execution time `think_time`. With probability `subagent_prob` a turn spawns `subagent_fanout`
    sub-agents that run concurrently, each a session of `subagent_turns` turns starting from the
    shared system prompt plus its own task of `task_len`; the parent waits for them and gets a
    tool result. A session ends after `turns` turns or before its context would pass `max_context`.
    """

    system_prompt_len: int = 4096
    task_len: LengthDist = field(default_factory=lambda: LengthDist("lognormal", 600, 0.8))
    turns: LengthDist = field(default_factory=lambda: LengthDist("uniform", 3, 12))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("lognormal", 150, 0.8))
    tool_result_len: LengthDist = field(default_factory=lambda: LengthDist("lognormal", 400, 1.0))
    think_time: float = 1.0  # median seconds; lognormal with log-sigma think_sigma
    think_sigma: float = 0.8
    subagent_prob: float = 0.1
    subagent_fanout: LengthDist = field(default_factory=lambda: LengthDist("uniform", 2, 4))
    subagent_turns: LengthDist = field(default_factory=lambda: LengthDist("uniform", 1, 4))
    max_context: int = 65536


# `small` fits the CPU demo (max-model-len 512 on the tiny model) and keeps runs short.
AGENTIC_PRESETS: dict[str, AgenticConfig] = {
    "agentx": AgenticConfig(),
    "small": AgenticConfig(
        system_prompt_len=96,
        task_len=LengthDist("lognormal", 40, 0.5),
        turns=LengthDist("uniform", 2, 5),
        output_len=LengthDist("lognormal", 24, 0.5),
        tool_result_len=LengthDist("lognormal", 32, 0.7),
        think_time=0.2,
        think_sigma=0.5,
        subagent_prob=0.15,
        subagent_fanout=LengthDist("uniform", 2, 3),
        subagent_turns=LengthDist("uniform", 1, 2),
        max_context=480,
    ),
}

_DIST_FIELDS = {
    "task_len",
    "turns",
    "output_len",
    "tool_result_len",
    "subagent_fanout",
    "subagent_turns",
}


def load_agentic_config(source: str | Path) -> AgenticConfig:
    """A preset name (`agentx`, `small`) or a TOML file overriding AgenticConfig's fields.

    The TOML may set `preset = "small"` to start from a preset; distributions are strings in
    parse_length's syntax (`"lognormal:600:0.8"`), the rest numbers.
    """
    text = str(source)
    if text in AGENTIC_PRESETS:
        return AGENTIC_PRESETS[text]
    path = Path(text)
    if not path.is_file():
        raise InputError(
            f"agentic config {text!r} is neither a preset ({', '.join(AGENTIC_PRESETS)}) nor a file"
        )
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from exc
    table = data.get("agentic", data)
    base_name = table.pop("preset", "agentx") if isinstance(table, dict) else "agentx"
    if base_name not in AGENTIC_PRESETS:
        raise InputError(f"{path}: preset {base_name!r} is not one of {', '.join(AGENTIC_PRESETS)}")
    names = {f.name for f in fields(AgenticConfig)}
    changes: dict[str, Any] = {}
    for key, value in table.items():
        if key not in names:
            raise InputError(
                f"{path}: unknown key {key!r}; allowed: preset, {', '.join(sorted(names))}"
            )
        if key in _DIST_FIELDS:
            changes[key] = parse_length(value, what=f"{path}: {key}")
        elif isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            changes[key] = type(getattr(AGENTIC_PRESETS[base_name], key))(value)
        else:
            raise InputError(f"{path}: {key} = {value!r} must be a number >= 0")
    cfg = replace(AGENTIC_PRESETS[base_name], **changes)
    if not 0 <= cfg.subagent_prob <= 1:
        raise InputError(f"{path}: subagent_prob = {cfg.subagent_prob} must be between 0 and 1")
    return cfg


@dataclass(frozen=True)
class AgenticWorkload:
    config: AgenticConfig = field(default_factory=AgenticConfig)
    name: str = "agentic"

    def sessions(self, seed: int) -> Iterator[Session]:
        cfg = self.config
        system = _ids(random.Random(f"agentic-system/{seed}"), cfg.system_prompt_len)
        rng = random.Random(f"agentic/{seed}")
        i = 0
        while True:
            yield self._session(rng, system, i, cfg.turns.sample(rng), top=True)
            i += 1

    def _think(self, rng: random.Random) -> float:
        cfg = self.config
        if cfg.think_time <= 0:
            return 0.0
        return rng.lognormvariate(math.log(cfg.think_time), cfg.think_sigma)

    def _session(
        self, rng: random.Random, system: list[int], sid: int, turns: int, *, top: bool
    ) -> Session:
        cfg = self.config
        ctx = system + _ids(rng, cfg.task_len.sample(rng))
        steps: list[RequestSpec | FanOut] = []
        for turn in range(turns):
            n_out = cfg.output_len.sample(rng)
            if len(ctx) + n_out > cfg.max_context:
                break
            steps.append(RequestSpec(list(ctx), len(ctx), n_out, self._think(rng) if turn else 0.0))
            ctx += _ids(rng, n_out)  # the assistant's turn (synthetic: identical for A and B)
            if top and rng.random() < cfg.subagent_prob:
                subs = [
                    self._session(rng, system, sid, cfg.subagent_turns.sample(rng), top=False)
                    for _ in range(cfg.subagent_fanout.sample(rng))
                ]
                subs = [s for s in subs if s.steps]
                if subs:
                    steps.append(FanOut(subs, self._think(rng)))
            ctx += _ids(rng, cfg.tool_result_len.sample(rng))
        return Session(sid, steps)

    def describe(self) -> dict[str, Any]:
        cfg = self.config
        out: dict[str, Any] = {"workload": self.name}
        for f in fields(cfg):
            v = getattr(cfg, f.name)
            out[f.name] = str(v) if isinstance(v, LengthDist) else v
        return out


# ---------------------------------------------------------------------------------------------
# replay and prompts files


def _read_rows(path: Path, what: str) -> list[Any]:
    if not path.is_file():
        raise InputError(f"{what} file {str(path)!r} does not exist")
    raw = path.read_bytes()
    stripped = raw.lstrip()
    if stripped[:1] == b"[":
        try:
            rows = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from exc
        return list(rows)
    rows = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            raise InputError(f"{path}:{n}: not a JSON object (expected one per line)") from None
    return rows


def _first(row: dict[str, Any], keys: Sequence[str]) -> Any:
    for k in keys:
        if k in row:
            return row[k]
    return None


@dataclass(frozen=True)
class ReplayWorkload:
    """A JSONL trace replayed on its own clock.

    Each line: `timestamp` in milliseconds (Mooncake traces) or `timestamp_s` in seconds;
    `input_length` (or `input_len`) or `prompt`; `output_length` (or `output_len`); optional
    `hash_ids` (Mooncake: one id per 512-token block, equal ids = shared prefix blocks).
    Timestamps are made relative to the first line and divided by `speed`.
    """

    rows: tuple[tuple[float, list[int] | str, int, int], ...]
    speed: float = 1.0
    name: str = "replay"

    @classmethod
    def from_file(cls, path: str | Path, *, speed: float = 1.0, block: int = 512) -> ReplayWorkload:
        p = Path(path)
        if speed <= 0:
            raise InputError(f"replay speed {speed!r} must be > 0")
        rows = []
        for n, row in enumerate(_read_rows(p, "replay"), 1):
            where = f"{p}:{n}"
            if not isinstance(row, dict):
                raise InputError(f"{where}: expected a JSON object")
            if "timestamp_s" in row:
                ts = float(row["timestamp_s"])
            elif "timestamp" in row:
                ts = float(row["timestamp"]) / 1000.0
            else:
                raise InputError(f"{where}: missing `timestamp` (ms) or `timestamp_s` (s)")
            out = _first(row, ("output_length", "output_len", "max_tokens"))
            if not isinstance(out, int) or out < 1:
                raise InputError(
                    f"{where}: `output_length` must be a whole number >= 1, got {out!r}"
                )
            prompt: list[int] | str
            if isinstance(row.get("prompt"), str):
                prompt = row["prompt"]
                n_in = max(1, len(prompt) // 4)
            else:
                n_in = _first(row, ("input_length", "input_len", "prompt_len"))
                if not isinstance(n_in, int) or n_in < 1:
                    raise InputError(
                        f"{where}: `input_length` must be a whole number >= 1 (or give `prompt`)"
                    )
                hashes = row.get("hash_ids") or []
                ids: list[int] = []
                for h in hashes:
                    ids += _ids(random.Random(f"block/{h}"), block)
                if len(ids) < n_in:
                    ids += _ids(random.Random(f"tail/{n}"), n_in - len(ids))
                prompt = ids[:n_in]
            rows.append((ts, prompt, n_in, out))
        if not rows:
            raise InputError(f"{p}: the trace has no requests")
        t0 = min(r[0] for r in rows)
        rows.sort(key=lambda r: r[0])
        return cls(tuple((r[0] - t0, r[1], r[2], r[3]) for r in rows), speed)

    def sessions(self, seed: int) -> Iterator[Session]:
        for i, (ts, prompt, n_in, n_out) in enumerate(self.rows):
            yield Session(i, [RequestSpec(prompt, n_in, n_out)], at=ts / self.speed)

    def describe(self) -> dict[str, Any]:
        return {"workload": self.name, "requests": len(self.rows), "speed": self.speed}


@dataclass(frozen=True)
class PromptsWorkload:
    """Prompts from a JSON list or JSONL file: strings, {"prompt": ...} objects (optional
    `output_len`), or ShareGPT conversations (first human turn). Shuffled by seed, then cycled."""

    prompts: tuple[tuple[str, int | None], ...]
    output_len: LengthDist
    name: str = "prompts"

    @classmethod
    def from_file(cls, path: str | Path, *, output_len: LengthDist) -> PromptsWorkload:
        p = Path(path)
        items: list[tuple[str, int | None]] = []
        for n, row in enumerate(_read_rows(p, "prompts"), 1):
            text: Any = None
            out = None
            if isinstance(row, str):
                text = row
            elif isinstance(row, dict):
                if "conversations" in row:
                    turns = row["conversations"] or []
                    human = [t.get("value") for t in turns if t.get("from") in ("human", "user")]
                    text = human[0] if human else None
                else:
                    text = _first(row, ("prompt", "text", "input"))
                out = _first(row, ("output_len", "output_length", "max_tokens"))
            if not isinstance(text, str) or not text:
                raise InputError(
                    f'{p}: item {n} has no prompt (want a string, {{"prompt": ...}} or '
                    "ShareGPT `conversations`)"
                )
            items.append((text, out if isinstance(out, int) and out > 0 else None))
        if not items:
            raise InputError(f"{p}: no prompts in the file")
        return cls(tuple(items), output_len)

    def sessions(self, seed: int) -> Iterator[Session]:
        rng = random.Random(f"prompts/{seed}")
        order = list(range(len(self.prompts)))
        rng.shuffle(order)
        i = 0
        while True:
            text, out = self.prompts[order[i % len(order)]]
            n_out = out or self.output_len.sample(rng)
            yield Session(i, [RequestSpec(text, max(1, len(text) // 4), n_out)])
            i += 1

    def describe(self) -> dict[str, Any]:
        return {
            "workload": self.name,
            "prompts": len(self.prompts),
            "output_len": str(self.output_len),
        }
