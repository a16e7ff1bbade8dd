"""The nginx edge of `serve --ab --canary/--shadow` (runtime.serving.proxy): its plan, its config
as nginx itself checks it, bad input, and (slow) real nginx in front of the session's CPU vLLM
server: canary shares against the weight and the SRM check, and a shadow whose every copy reaches
vLLM under the id the edge gave its primary.

nginx comes from the distribution (`apt-get install nginx`): tests that run it skip without it,
except under KIMICTL_TEST_NEEDS_NGINX=1 (.ci/run installs it and sets it), where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import Server, free_port

from kimictl.core.errors import InputError
from kimictl.runtime.serving.proxy import CANARY, SHADOW, Proxy, plan_edge, render_nginx
from kimictl.runtime.verdict.strata import srm_check


def _nginx() -> str:
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )
    if found is None:
        why = "nginx missing: apt-get install nginx"
        if os.environ.get("KIMICTL_TEST_NEEDS_NGINX"):  # set by .ci/run, which installs it
            pytest.fail(why)
        pytest.skip(why)
    return found


def _plan(port: int = 18080, **kw: float | None) -> object:
    args = {"canary": None, "shadow": None} | kw
    return plan_edge(
        host="127.0.0.1",
        port=port,
        tuned="http://127.0.0.1:8000",
        stock="http://127.0.0.1:8001",
        **args,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"canary": 0.0}, "--canary 0 is out of range"),
        ({"canary": 100.0}, "--canary 100 is out of range"),
        ({"shadow": 0.0}, "--shadow 0 is out of range"),
        ({"canary": 10.0, "shadow": 10.0}, "--canary and --shadow at once"),
        ({"canary": 12.345}, "steps of 0.01%"),
    ],
)
def test_bad_edge_plans_say_why(kw: dict[str, float], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        _plan(**kw)


@pytest.mark.parametrize("kw", [{"canary": 12.5}, {"shadow": 100.0}, {"shadow": 0.5}])
def test_nginx_accepts_the_rendered_config(tmp_path: Path, kw: dict[str, float]) -> None:
    """`nginx -t` (the binary's own parser) on the config, every path inside the run folder."""
    binary = _nginx()
    plan = _plan(**kw)
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp_path / "tmp" / kind).mkdir(parents=True)
    conf = tmp_path / "nginx.conf"
    text = render_nginx(plan, tmp_path)  # type: ignore[arg-type]
    conf.write_text(text)
    out = subprocess.run(
        [binary, "-p", str(tmp_path), "-c", str(conf), "-t"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "/etc/" not in text and "/var/" not in text
    pct = next(iter(kw.values()))
    assert f" {pct:g}% " in text
    assert ("mirror /_kimictl_mirror;" in text) == ("shadow" in kw)


def test_serve_refuses_an_edge_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    from kimictl.cli import main

    cases = [
        (["serve", "--canary", "10"], "add --ab"),
        (["serve", "--ab", "--canary", "10", "--detach"], "drop --detach"),
        (["serve", "--ab", "--canary", "10", "--shadow", "5"], "--canary and --shadow at once"),
        (["serve", "--proxy-port", "9000"], "--proxy-port goes with"),
    ]
    for args, message in cases:
        assert main([*args, "--dry-run"]) == 2, args
        out, err = capsys.readouterr()
        assert err.startswith("error:") and message in err, (args, err)
        assert "Traceback" not in err
    assert main(["serve", "--ab", "--canary", "150", "--dry-run"]) == 2
    assert main(["serve", "cpu-demo-stock", "--ab", "--canary", "10", "--dry-run"]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("error:") and "has no stock twin" in err


def test_missing_nginx_is_one_sentence_naming_the_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No nginx on PATH nor in /usr/sbin: serve refuses before any server starts."""
    import kimictl.runtime.serving.proxy as proxy_mod
    from kimictl.cli import main

    which, access = shutil.which, os.access
    monkeypatch.setattr(
        proxy_mod.shutil, "which", lambda n, *a, **k: None if n == "nginx" else which(n, *a, **k)
    )
    monkeypatch.setattr(
        proxy_mod.os, "access", lambda p, m: False if "nginx" in str(p) else access(p, m)
    )
    assert main(["serve", "--ab", "--shadow", "100", "--dry-run"]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("error: nginx is not installed") and "apt-get install nginx" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_hung_shadow_does_not_hold_the_clients_next_request(tmp_path: Path) -> None:
    """Real nginx, shadow 100 %: the shadow accepts connections and never answers (a stopped
    server); the primary (a one-line HTTP server) answers at once. nginx ends a request only
    when its mirror does: on a kept-alive client connection the next request would wait for the
    mirror's read timeout; the edge closes client connections instead, so it does not."""
    import http.server
    import threading
    import time

    _nginx()

    class Ok(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    stock = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=stock.serve_forever, daemon=True).start()
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)  # the kernel completes the handshakes; nobody reads
        edge = plan_edge(
            canary=None,
            shadow=100,
            host="127.0.0.1",
            port=free_port(),
            tuned=f"http://127.0.0.1:{hung.getsockname()[1]}",
            stock=f"http://127.0.0.1:{stock.server_address[1]}",
        )
        with Proxy(edge, tmp_path) as proxy, httpx.Client() as client:
            t0 = time.monotonic()
            for _ in range(3):
                reply = client.post(f"{proxy.plan.url}/v1/completions", json={}, timeout=10)
                assert reply.text == "ok"
                assert reply.headers.get("connection") == "close"
            assert time.monotonic() - t0 < 3.0  # the mirrors are still hanging
            proxy.stop(grace=0.2)  # a graceful stop would wait for the hung mirrors
    stock.shutdown()


def test_a_taken_proxy_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    _nginx()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proxy = Proxy(_plan(port=port, canary=50.0), tmp_path)  # type: ignore[arg-type]
        with pytest.raises(InputError, match=f"port {port} on 127.0.0.1 is already in use"):
            proxy.start()
    assert proxy.process is None


def _complete(url: str, model: str, client: httpx.Client) -> tuple[str, str, str]:
    """(the arm nginx chose, the id nginx gave the request, the id vLLM answered with)."""
    reply = client.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": "hello", "max_tokens": 2, "temperature": 0},
        timeout=120,
    )
    reply.raise_for_status()
    return reply.headers["X-Kimictl-Arm"], reply.headers["X-Request-Id"], reply.json()["id"]


def _stream(url: str, model: str, client: httpx.Client) -> tuple[str, str, str]:
    """The same, streamed (SSE): the id is on every chunk."""
    body = {"model": model, "prompt": "hello", "max_tokens": 8, "temperature": 0, "stream": True}
    with client.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as reply:
        reply.raise_for_status()
        ids = {
            json.loads(line[6:])["id"] for line in reply.iter_lines() if line.startswith("data: {")
        }
        (vllm_id,) = ids
        return reply.headers["X-Kimictl-Arm"], reply.headers["X-Request-Id"], vllm_id


def _success_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


@pytest.mark.slow
def test_real_nginx_splits_and_mirrors_in_front_of_vllm(tmp_path: Path, cpu_server: Server) -> None:
    """Both arms are the session's one server (tuned and stock upstreams at one address): the
    split is nginx's, the truth is vLLM's own answer (the id it saw) and its request counter."""
    _nginx()
    port = free_port()
    edge = dict(host="127.0.0.1", port=port, tuned=cpu_server.url, stock=cpu_server.url)
    with Proxy(plan_edge(canary=50, shadow=None, **edge), tmp_path / "canary") as proxy:
        assert proxy.plan.mode == CANARY
        with httpx.Client() as client, ThreadPoolExecutor(4) as pool:
            rows = list(
                pool.map(lambda _: _complete(proxy.plan.url, cpu_server.model, client), range(100))
            )
    for _, edge_id, vllm_id in rows:
        assert vllm_id == f"cmpl-{edge_id}", (edge_id, vllm_id)  # vLLM saw the edge's id
    assert len({edge_id for _, edge_id, _ in rows}) == 100
    counts = Counter(arm for arm, _, _ in rows)
    assert set(counts) == {"tuned", "stock"}
    right = srm_check(counts, {"tuned": 50, "stock": 50})
    assert not right.mismatch, right
    wrong = srm_check(counts, {"tuned": 10, "stock": 90})
    assert wrong.mismatch, wrong

    # shadow 100%: every request answered by stock and copied to tuned under the same id; half
    # streamed (a mirror is a header-only subrequest: unless nginx stores the body, it hangs up
    # on a streamed copy at its headers and vLLM aborts it, which its success counter shows)
    before = _success_total(cpu_server.url)
    with Proxy(plan_edge(canary=None, shadow=100, **edge), tmp_path / "shadow") as proxy:
        assert proxy.plan.mode == SHADOW
        with httpx.Client() as client:
            rows = [_complete(proxy.plan.url, cpu_server.model, client) for _ in range(10)]
            rows += [_stream(proxy.plan.url, cpu_server.model, client) for _ in range(10)]
    after = _success_total(cpu_server.url)
    assert {arm for arm, _, _ in rows} == {"stock"}
    for _, edge_id, vllm_id in rows:
        assert vllm_id == f"cmpl-{edge_id}", (edge_id, vllm_id)
    assert after - before == 40  # 20 primaries + 20 whole mirrors, as vLLM counted them
    log = (tmp_path / "shadow" / "access.log").read_text().splitlines()
    assert len(log) == 20


def test_monitor_without_targets_judges_the_pairs_own_edge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """serve --ab --canary/--shadow writes its edge into both run records; a bare `monitor`
    picks the canary or shadow from there."""
    from kimictl.commands import monitor as cmd
    from kimictl.runtime.serving import runs

    class Rec:
        def __init__(self, extra: dict[str, object]) -> None:
            self.extra = extra

    edge = _plan(canary=12.5).to_json()  # type: ignore[attr-defined]
    monkeypatch.setattr(runs, "latest_ab_pair", lambda: (Rec({"edge": edge}), Rec({})))
    assert cmd._edge_of_latest_pair() == (12.5, None)
    edge = _plan(shadow=100.0).to_json()  # type: ignore[attr-defined]
    monkeypatch.setattr(runs, "latest_ab_pair", lambda: (Rec({"edge": edge}), Rec({})))
    assert cmd._edge_of_latest_pair() == (None, 100.0)
    monkeypatch.setattr(runs, "latest_ab_pair", lambda: (Rec({}), Rec({})))
    assert cmd._edge_of_latest_pair() == (None, None)
