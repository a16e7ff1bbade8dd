"""Workloads: seeded determinism, length distributions, agentic session shape, trace and prompt
files, TOML overrides and their error messages."""

from __future__ import annotations

import itertools
import math
import statistics
from pathlib import Path

import orjson
import pytest

from kimictl.core.errors import InputError
from kimictl.runtime.load.workloads import (
    AGENTIC_PRESETS,
    TOKEN_HI,
    TOKEN_LO,
    AgenticWorkload,
    FanOut,
    PromptsWorkload,
    RandomWorkload,
    ReplayWorkload,
    RequestSpec,
    load_agentic_config,
    parse_length,
    prompt_text,
)


def _flat(sessions):
    """Every request of the sessions, depth-first, with its session id."""
    for s in sessions:
        for step in s.steps:
            if isinstance(step, FanOut):
                yield from _flat(step.sessions)
            else:
                yield s.id, step


@pytest.mark.parametrize(
    ("text", "kind", "a", "b"),
    [
        ("256", "fixed", 256, 0),
        ("8:64", "uniform", 8, 64),
        ("uniform:1:2", "uniform", 1, 2),
        ("lognormal:300:0.5", "lognormal", 300, 0.5),
    ],
)
def test_parse_length_forms(text: str, kind: str, a: float, b: float) -> None:
    d = parse_length(text)
    assert (d.kind, d.a, d.b) == (kind, a, b)
    assert parse_length(str(d)) == d  # str() round-trips


@pytest.mark.parametrize("bad", ["0", "abc", "5:2", "1.5", "lognormal:0:1", "uniform:1", "-3"])
def test_parse_length_rejects_with_the_allowed_forms(bad: str) -> None:
    with pytest.raises(InputError, match="--input-len") as err:
        parse_length(bad, what="--input-len")
    assert repr(bad) in err.value.message


def test_length_samples_follow_the_distribution() -> None:
    import random

    rng = random.Random(3)
    uni = [parse_length("10:20").sample(rng) for _ in range(5000)]
    assert min(uni) == 10 and max(uni) == 20
    logn = [parse_length("lognormal:200:0.6").sample(rng) for _ in range(20000)]
    assert statistics.median(logn) == pytest.approx(200, rel=0.05)
    assert max(logn) <= 16 * 200 and min(logn) >= 1
    assert statistics.fmean(logn) == pytest.approx(200 * math.exp(0.18), rel=0.05)


def test_random_is_deterministic_per_seed_and_lengths_exact() -> None:
    w = RandomWorkload(parse_length("16:64"), parse_length("4:8"), prefix_len=5)
    a = list(itertools.islice(w.sessions(1), 20))
    b = list(itertools.islice(w.sessions(1), 20))
    c = list(itertools.islice(w.sessions(2), 20))
    assert a == b and a != c
    prefixes = {tuple(s.steps[0].prompt[:5]) for s in a}
    assert len(prefixes) == 1  # the shared prefix is shared
    for s in a:
        (spec,) = s.steps
        assert isinstance(spec, RequestSpec)
        assert len(spec.prompt) == spec.input_len and 21 <= spec.input_len <= 69
        assert 4 <= spec.output_len <= 8
        assert all(TOKEN_LO <= t < TOKEN_HI for t in spec.prompt)


def test_agentic_sessions_grow_context_and_share_the_system_prompt() -> None:
    cfg = AGENTIC_PRESETS["small"]
    w = AgenticWorkload(cfg)
    sessions = list(itertools.islice(w.sessions(0), 40))
    assert sessions == list(itertools.islice(w.sessions(0), 40))
    reqs = list(_flat(sessions))
    system = reqs[0][1].prompt[: cfg.system_prompt_len]
    for _, spec in reqs:
        assert spec.prompt[: cfg.system_prompt_len] == system
        assert spec.input_len + spec.output_len <= cfg.max_context
    multi = 0
    for s in sessions:
        turns = [st for st in s.steps if isinstance(st, RequestSpec)]
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt.prompt[: len(prev.prompt)] == prev.prompt  # context grows by appending
            assert len(nxt.prompt) > len(prev.prompt) + prev.output_len
            assert nxt.think_time > 0
            multi += 1
    assert multi > 20
    assert any(isinstance(st, FanOut) for s in sessions for st in s.steps)


def test_agentic_fanout_always_when_probability_is_one(tmp_path: Path) -> None:
    toml = tmp_path / "a.toml"
    toml.write_text('preset = "small"\nsubagent_prob = 1.0\nsubagent_fanout = "3"\nturns = "2"\n')
    cfg = load_agentic_config(toml)
    assert cfg.subagent_prob == 1.0 and cfg.system_prompt_len == 96
    (s,) = itertools.islice(AgenticWorkload(cfg).sessions(0), 1)
    fans = [st for st in s.steps if isinstance(st, FanOut)]
    assert fans and all(len(f.sessions) == 3 for f in fans)
    assert s.num_requests == 2 + sum(x.num_requests for f in fans for x in f.sessions)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("bogus = 1", "unknown key 'bogus'"),
        ('turns = "x"', "turns"),
        ("subagent_prob = 2", "between 0 and 1"),
        ('preset = "nope"', "preset 'nope'"),
        ("= broken", "not valid TOML"),
    ],
)
def test_agentic_toml_errors_name_file_and_key(tmp_path: Path, body: str, needle: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(body + "\n")
    with pytest.raises(InputError, match="bad.toml") as err:
        load_agentic_config(p)
    assert needle in err.value.message


def test_unknown_preset_or_missing_file() -> None:
    with pytest.raises(InputError, match="neither a preset"):
        load_agentic_config("no-such-thing")


def test_replay_trace_mooncake_style(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 3500, "input_length": 700, "output_length": 7, "hash_ids": [1, 3]},
        {"timestamp_s": 1.5, "prompt": "hello there world", "output_len": 2},
    ]
    p = tmp_path / "t.jsonl"
    p.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    w = ReplayWorkload.from_file(p, speed=2.0)
    sessions = list(w.sessions(0))
    assert [s.at for s in sessions] == [0.0, 0.25, 1.25]  # relative, sorted, divided by speed
    a, c, b = (s.steps[0] for s in sessions)
    assert a.input_len == 600 and len(a.prompt) == 600
    assert a.prompt[:512] == b.prompt[:512]  # same first hash id -> same first block
    assert a.prompt[512:600] != b.prompt[512:600]
    assert c.prompt == "hello there world" and c.output_len == 2


def test_replay_errors_name_the_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 1, "input_length": 3, "output_length": 2}\n{"input_length": 3}\n')
    with pytest.raises(InputError, match=r"t.jsonl:2: missing `timestamp`"):
        ReplayWorkload.from_file(p)
    p.write_text("not json\n")
    with pytest.raises(InputError, match=r"t.jsonl:1: not a JSON object"):
        ReplayWorkload.from_file(p)


def test_prompts_file_sharegpt_and_plain(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_bytes(
        orjson.dumps(
            [
                {
                    "conversations": [
                        {"from": "human", "value": "Q1?"},
                        {"from": "gpt", "value": "A"},
                    ]
                },
                {"prompt": "second", "output_len": 3},
                "third",
            ]
        )
    )
    w = PromptsWorkload.from_file(p, output_len=parse_length(9))
    first = [s.steps[0] for s in itertools.islice(w.sessions(5), 6)]
    texts = [r.prompt for r in first]
    assert sorted(texts[:3]) == ["Q1?", "second", "third"] and texts[3:] == texts[:3]
    outs = {r.prompt: r.output_len for r in first}
    assert outs == {"Q1?": 9, "second": 3, "third": 9}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n')
    with pytest.raises(InputError, match="item 1 has no prompt"):
        PromptsWorkload.from_file(bad, output_len=parse_length(1))


def test_prompt_text_renders_ids_as_words() -> None:
    text = prompt_text(RequestSpec([TOKEN_LO, TOKEN_LO + 1, TOKEN_LO], 3, 1))
    words = text.split()
    assert len(words) == 3 and words[0] == words[2] != words[1]
