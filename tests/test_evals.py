"""The checks' math: statistics against known values, the schema validator, and every check's
scoring on responses recorded from real vLLM CPU servers (tests/fixtures/evals/, captured with
lab/bench/validate_false_alarms.py --capture: an identical twin and a twin with its last layer
scaled by 1+1e-2)."""

from __future__ import annotations

import contextlib
import json
import math
import random
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimictl.core.errors import EndpointError, InputError
from kimictl.runtime.evals import greedy, longctx, sampling, structured
from kimictl.runtime.evals.client import Endpoint
from kimictl.runtime.evals.plan import CHECKS, Thresholds, plan_for
from kimictl.runtime.evals.prompts import filler_text, greedy_prompts, mrcr_task, needle_task
from kimictl.runtime.evals.report import CheckStatus
from kimictl.runtime.evals.runner import score_check
from kimictl.runtime.evals.schema import unsupported_keywords, validate
from kimictl.runtime.evals.stats import (
    chi2_homogeneity,
    chi2_sf,
    gammaincc,
    percentile,
    total_variation,
)

FIXTURES = Path(__file__).parent / "fixtures" / "evals"


# --- statistics -----------------------------------------------------------------------------------
# Critical values of the chi-square distribution (standard tables).
CHI2_TABLE = [
    (3.841458820694124, 1, 0.05),
    (6.6348966010212145, 1, 0.01),
    (10.827566170662733, 1, 0.001),
    (5.991464547107979, 2, 0.05),
    (18.307038053275146, 10, 0.05),
    (29.58829844507442, 10, 0.001),
    (124.34211340400407, 100, 0.05),
]


@pytest.mark.parametrize(("x", "df", "p"), CHI2_TABLE)
def test_chi2_sf_matches_table(x: float, df: int, p: float) -> None:
    assert chi2_sf(x, df) == pytest.approx(p, rel=1e-5)


def test_gammaincc_closed_forms() -> None:
    # Q(1, x) = exp(-x); Q(1/2, x) = erfc(sqrt(x)): both branches (x < a+1 and x >= a+1)
    for x in (0.1, 0.9, 2.5, 10.0, 40.0):
        assert gammaincc(1.0, x) == pytest.approx(math.exp(-x), rel=1e-10)
        assert gammaincc(0.5, x) == pytest.approx(math.erfc(math.sqrt(x)), rel=1e-9)
    assert gammaincc(3.0, 0.0) == 1.0
    with pytest.raises(ValueError):
        gammaincc(0.0, 1.0)


def test_chi2_homogeneity_identical_and_different() -> None:
    same = chi2_homogeneity({1: 50, 2: 30, 3: 20}, {1: 50, 2: 30, 3: 20})
    assert same.statistic == 0.0 and same.p_value == 1.0 and same.df == 2
    # 2x2 table, hand-computed: expected 65/35 per side, stat = 4 * 15^2 / 65 * ... (see below)
    diff = chi2_homogeneity({1: 80, 2: 20}, {1: 50, 2: 50})
    expected = sum((o - e) ** 2 / e for o, e in ((80, 65), (20, 35), (50, 65), (50, 35)))
    assert diff.statistic == pytest.approx(expected)
    assert diff.p_value == pytest.approx(chi2_sf(expected, 1))
    assert diff.p_value < 1e-4


def test_chi2_homogeneity_pools_rare_cells() -> None:
    # 40 categories seen once each cannot be tested cell by cell: they pool into one cell
    a = {1: 100, **{100 + i: 1 for i in range(20)}}
    b = {1: 100, **{200 + i: 1 for i in range(20)}}
    result = chi2_homogeneity(a, b)
    assert result.pooled == 40
    assert result.cells == 2
    assert result.p_value == pytest.approx(1.0)


def test_chi2_false_alarm_rate_is_near_alpha() -> None:
    # Two samples from one distribution: the test rejects at alpha=0.05 about 5% of the time.
    rng = random.Random(0)
    weights = [0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05]
    rejections = 0
    trials = 400
    for _ in range(trials):
        a = rng.choices(range(8), weights, k=300)
        b = rng.choices(range(8), weights, k=300)
        ca = {k: a.count(k) for k in set(a)}
        cb = {k: b.count(k) for k in set(b)}
        rejections += chi2_homogeneity(ca, cb).p_value < 0.05
    assert 0.02 <= rejections / trials <= 0.09


def test_chi2_detects_a_shifted_distribution() -> None:
    rng = random.Random(1)
    a = rng.choices(range(4), [0.4, 0.3, 0.2, 0.1], k=400)
    b = rng.choices(range(4), [0.3, 0.3, 0.2, 0.2], k=400)
    p = chi2_homogeneity({k: a.count(k) for k in set(a)}, {k: b.count(k) for k in set(b)}).p_value
    assert p < 1e-3


def test_total_variation() -> None:
    assert total_variation({1: 5, 2: 5}, {1: 5, 2: 5}) == 0.0
    assert total_variation({1: 10}, {2: 3}) == 1.0
    assert total_variation({1: 3, 2: 1}, {1: 1, 2: 1}) == pytest.approx(0.25)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=50),
    st.lists(st.integers(0, 5), min_size=1, max_size=50),
)
def test_total_variation_bounds_and_symmetry(a: list[int], b: list[int]) -> None:
    ca = {k: a.count(k) for k in set(a)}
    cb = {k: b.count(k) for k in set(b)}
    tv = total_variation(ca, cb)
    assert 0.0 <= tv <= 1.0 + 1e-12
    assert tv == pytest.approx(total_variation(cb, ca))


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 100) == 5.0


# --- schema validator -----------------------------------------------------------------------------
SCHEMA = structured.SCHEMAS["verdict"]


def test_schema_accepts_valid_and_names_each_violation() -> None:
    assert validate({"answer": "yes", "confidence": 7}, SCHEMA) == []
    errors = validate({"answer": "maybe", "confidence": 101, "extra": 1}, SCHEMA)
    assert any("'maybe' not in" in e for e in errors)
    assert any("101 > maximum 100" in e for e in errors)
    assert any("unexpected property 'extra'" in e for e in errors)
    assert validate({"answer": "no"}, SCHEMA) == ["$: missing required 'confidence'"]
    assert validate({"answer": "no", "confidence": True}, SCHEMA) == [
        "$.confidence: expected integer, got bool"
    ]
    assert validate([1], SCHEMA) == ["$: expected object, got list"]


def test_schema_arrays_and_strings() -> None:
    tags = structured.SCHEMAS["tags"]
    assert validate({"tags": ["fast"], "priority": "low"}, tags) == []
    assert validate({"tags": [], "priority": "low"}, tags) == ["$.tags: 0 items < minItems 1"]
    assert validate({"tags": ["fast", "x"], "priority": "low"}, tags) == [
        "$.tags[1]: 'x' not in " + repr(tags["properties"]["tags"]["items"]["enum"])
    ]
    assert validate("abc", {"type": "string", "maxLength": 2}) == ["$: length 3 > maxLength 2"]


def test_schema_refuses_keywords_it_does_not_implement() -> None:
    assert unsupported_keywords(SCHEMA) == []
    assert unsupported_keywords({"type": "string", "pattern": "^a"}) == ["$: pattern"]
    assert unsupported_keywords({"properties": {"x": {"oneOf": []}}}) == ["$.x: oneOf"]
    for schema in structured.SCHEMAS.values():
        assert unsupported_keywords(schema) == []


def test_structured_problems() -> None:
    ok = {"schema": "verdict", "text": '{"answer":"no","confidence":3}', "finish_reason": "stop"}
    assert structured.problems(ok) == []
    cut = {**ok, "text": '{"answer":"no","conf', "finish_reason": "length"}
    bad = structured.problems(cut)
    assert bad[0].startswith("finish_reason 'length'") and "not JSON" in bad[1]
    # a raw control character inside a string is not JSON (what xgrammar 0.2.8 let through)
    ctrl = {**ok, "text": '{"answer":"no\x06","confidence":3}'}
    assert "not JSON" in structured.problems(ctrl)[0]


# --- prompts ------------------------------------------------------------------------------------
def test_prompts_are_deterministic_and_distinct() -> None:
    assert filler_text(3, 50) == filler_text(3, 50)
    assert filler_text(3, 50) != filler_text(4, 50)
    assert len(filler_text(3, 50).split()) == 50
    prompts = greedy_prompts(12)
    assert len(set(prompts)) == 12 and prompts == greedy_prompts(12)
    needle = needle_task(5, 0.5)
    assert needle.answer in needle.insert and needle.answer not in needle.question
    mrcr = mrcr_task(5, 0.5)
    assert mrcr.answer in mrcr.insert and mrcr.answer not in mrcr.question


def test_retrieval_fit_places_insert_at_depth_with_exact_length() -> None:
    task = needle_task(1, 0.25)
    filler = list(range(1000, 2000))
    tokens = longctx._fit(task, filler, [1, 2, 3], [7, 8], 500)
    assert len(tokens) == 500
    at = tokens.index(1)
    assert tokens[at : at + 3] == [1, 2, 3] and tokens[-2:] == [7, 8]
    assert at == int(0.25 * (500 - 5))
    assert longctx.exact_match("  4827 is it", "4827") and not longctx.exact_match(
        "the 4827", "4827"
    )


# --- client errors (a real HTTP server on loopback, answering as told) ---------------------------
@contextlib.contextmanager
def _server(answer: Callable[[str], tuple[int, Any]]) -> Iterator[str]:
    """A loopback HTTP server whose replies come from `answer(path) -> (status, JSON body)`."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            status, payload = answer(self.path)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _reply

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_client_http_error_names_endpoint_path_and_server_message() -> None:
    def answer(path: str) -> tuple[int, Any]:
        if path == "/v1/models":
            return 200, {"data": [{"id": "m", "max_model_len": 4096}]}
        return 400, {"error": {"message": "structured outputs are disabled"}}

    with _server(answer) as url, Endpoint(url + "/v1", name="cand") as ep:
        assert ep.base == url and ep.model == "m" and ep.max_model_len == 4096
        with pytest.raises(EndpointError, match="cand: /v1/completions answered HTTP 400: struct"):
            ep.complete([1, 2], max_tokens=1)


def test_client_model_checks() -> None:
    with _server(lambda _p: (200, {"data": [{"id": "m"}]})) as url, Endpoint(url) as ep:
        with pytest.raises(EndpointError, match="no max_model_len"):
            _ = ep.max_model_len

    with (
        _server(lambda _p: (200, {"data": [{"id": "a", "max_model_len": 1}]})) as url,
        Endpoint(url, model="b") as ep,
    ):
        with pytest.raises(InputError, match="does not serve model 'b' \\(it serves a\\)"):
            _ = ep.model
    with pytest.raises(InputError, match="must start with http"):
        Endpoint("127.0.0.1:8000")


def test_client_transport_error() -> None:
    # finished_requests() reads /metrics through observe.scrape: tests/test_scrape_filter.py
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(EndpointError, match=f"cannot reach http://127.0.0.1:{port}/v1/models"):
            _ = Endpoint(f"http://127.0.0.1:{port}/v1", name="cand").model


def test_thresholds_overrides() -> None:
    th = Thresholds().with_overrides(["greedy_max_abs_dlogprob=0.5", " sampling_alpha = 0.01"])
    assert th.greedy_max_abs_dlogprob == 0.5 and th.sampling_alpha == 0.01
    with pytest.raises(InputError, match="NAME=VALUE"):
        Thresholds().with_overrides(["greedy_max_abs_dlogprob"])


# --- scoring on synthetic responses: each failure mode is caught ---------------------------
def _greedy_side(tokens: list[int], lps: list[float]) -> dict[str, Any]:
    top = [{str(t): lp, str(t + 1000): lp - 1.0} for t, lp in zip(tokens, lps, strict=True)]
    return {"tokens": tokens, "logprobs": lps, "top": top}


def test_greedy_score_divergence_and_deltas() -> None:
    ref = [_greedy_side([1, 2, 3, 4], [-1.0, -1.0, -1.0, -1.0])]
    same = greedy.score(ref, ref, Thresholds(), top_k=2)
    assert same.status is CheckStatus.PASS and same.metrics["token_agreement"] == 1.0
    # diverges at token 2; before it the chosen-token logprob moved by 0.25
    cand = [_greedy_side([1, 2, 9, 9], [-1.0, -1.25, -0.5, -0.5])]
    cand[0]["top"][2][
        "3"
    ] = -0.75  # the candidate's score of the reference's token at the divergence
    result = greedy.score(cand, ref, Thresholds(), top_k=2)
    assert result.status is CheckStatus.FAIL
    assert result.metrics["first_divergence"] == [2]
    assert result.metrics["token_agreement"] == 0.5
    assert result.metrics["max_abs_dlogprob"] == pytest.approx(0.25)
    assert result.metrics["compared_positions"] == 3  # positions 0, 1 and the divergence step 2
    assert any("token agreement 0.500 < 0.95" in f for f in result.failures)


def test_long_context_bands_place_deep_errors_in_the_last_band() -> None:
    n = 400
    ref = {
        "max_len": 400,
        "docs": [{"doc": 0, "length": n, "logprobs": [None] + [-2.0] * (n - 1)}],
        "retrieval": [],
    }
    lps = [None] + [-2.0] * (n - 1)
    lps[350] = -2.5  # only deep in the context
    cand = {**ref, "docs": [{"doc": 0, "length": n, "logprobs": lps}]}
    result = longctx.score(cand, ref, Thresholds(), bands=4)
    bands = result.metrics["bands"]
    assert [b["max_abs_dlogprob"] for b in bands] == [0.0, 0.0, 0.0, 0.5]
    assert result.status is CheckStatus.FAIL
    assert result.failures[0].startswith("band 300-400: max |dlogprob| 0.5")


def test_retrieval_drop_fails_but_equal_scores_pass() -> None:
    def side(texts: list[str]) -> dict[str, Any]:
        items = [{"kind": "needle", "answer": "123", "text": t} for t in texts]
        return {"max_len": 10, "docs": [], "retrieval": items}

    ok = longctx.score(side([" 123", "x"]), side([" 123", "y"]), Thresholds())
    assert ok.status is CheckStatus.PASS
    assert ok.metrics["retrieval"]["needle"]["candidate_exact_match"] == 0.5
    worse = longctx.score(side(["x", "x"]), side(["123", "123"]), Thresholds())
    assert worse.status is CheckStatus.FAIL and "trails reference 2/2" in worse.failures[0]


def test_sampling_score_flags_shift_and_unreproducible_seed() -> None:
    rng = random.Random(3)
    a = rng.choices(range(5), [0.5, 0.2, 0.1, 0.1, 0.1], k=400)
    b = rng.choices(range(5), [0.5, 0.2, 0.1, 0.1, 0.1], k=400)
    c = rng.choices(range(5), [0.3, 0.3, 0.2, 0.1, 0.1], k=400)
    seeded_ok = [{"prompt": 0, "seed": 1, "runs": [[1, 2], [1, 2]]}]
    draws = lambda toks: [{"prefix": 0, "temperature": 1.0, "top_p": 1.0, "tokens": toks}]  # noqa: E731
    same = sampling.score(
        {"draws": draws(a), "seeded": seeded_ok},
        {"draws": draws(b), "seeded": seeded_ok},
        Thresholds(),
    )
    assert same.status is CheckStatus.PASS
    shifted = sampling.score(
        {"draws": draws(c), "seeded": seeded_ok},
        {"draws": draws(b), "seeded": seeded_ok},
        Thresholds(),
    )
    assert shifted.status is CheckStatus.FAIL and "distributions differ" in shifted.failures[0]
    flaky = [{"prompt": 0, "seed": 1, "runs": [[1, 2], [1, 3]]}]
    unrepro = sampling.score(
        {"draws": draws(a), "seeded": flaky}, {"draws": draws(b), "seeded": seeded_ok}, Thresholds()
    )
    assert unrepro.failures == ["candidate: 1/1 seeded requests not reproducible"]


# --- scoring on responses recorded from real vLLM CPU servers -------------------------------------
def _recorded(name: str) -> dict[str, Any]:
    path = FIXTURES / f"{name}.json"
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict[str, Any]]:
    return {n: _recorded(n) for n in ("identical_a", "identical_b", "perturbed")}


@pytest.mark.parametrize("check", CHECKS)
def test_recorded_identical_servers_pass_every_check(recorded: dict[str, Any], check: str) -> None:
    plan = plan_for(recorded["identical_a"]["mode"] == "quick")
    cand = recorded["identical_b"]["responses"][check]
    ref = recorded["identical_a"]["responses"][check]
    result = score_check(check, cand, ref, Thresholds(), plan)
    assert result.status is CheckStatus.PASS, result.failures
    assert result.failures == []


def test_recorded_identical_servers_agree_exactly(recorded: dict[str, Any]) -> None:
    # The CPU kernels are deterministic across processes: the margin under the thresholds is total.
    plan = plan_for(recorded["identical_a"]["mode"] == "quick")
    a, b = recorded["identical_a"]["responses"], recorded["identical_b"]["responses"]
    greedy_result = score_check("greedy", b["greedy"], a["greedy"], Thresholds(), plan)
    assert greedy_result.metrics["max_abs_dlogprob"] == 0.0
    assert greedy_result.metrics["token_agreement"] == 1.0
    lc = score_check("long_context", b["long_context"], a["long_context"], Thresholds(), plan)
    assert lc.metrics["max_abs_dlogprob"] == 0.0
    assert sum(band["positions"] for band in lc.metrics["bands"]) > 1000


def test_recorded_perturbed_twin_fails_greedy_and_long_context(recorded: dict[str, Any]) -> None:
    plan = plan_for(recorded["perturbed"]["mode"] == "quick")
    ref = recorded["identical_a"]["responses"]
    cand = recorded["perturbed"]["responses"]
    greedy_result = score_check("greedy", cand["greedy"], ref["greedy"], Thresholds(), plan)
    assert greedy_result.status is CheckStatus.FAIL
    assert greedy_result.metrics["token_agreement"] < 0.95
    assert greedy_result.metrics["prompts_identical"] < greedy_result.metrics["prompts"]
    lc = score_check("long_context", cand["long_context"], ref["long_context"], Thresholds(), plan)
    assert lc.status is CheckStatus.FAIL
    # the perturbation shows in every band, far above the threshold (not a marginal call)
    th = Thresholds()
    for band in lc.metrics["bands"]:
        assert band["mean_abs_dlogprob"] > 5 * th.lc_mean_abs_dlogprob
        assert band["max_abs_dlogprob"] > 5 * th.lc_max_abs_dlogprob


def test_recorded_perturbed_twin_still_serves_structured_and_full_context(
    recorded: dict[str, Any],
) -> None:
    # A numerically wrong twin still completes requests: only numerics checks can catch it.
    plan = plan_for(recorded["perturbed"]["mode"] == "quick")
    ref = recorded["identical_a"]["responses"]
    cand = recorded["perturbed"]["responses"]
    for check in ("structured", "full_context"):
        result = score_check(check, cand[check], ref[check], Thresholds(), plan)
        assert result.status is CheckStatus.PASS, (check, result.failures)
