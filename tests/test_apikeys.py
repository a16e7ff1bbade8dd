"""API key files: a key file that is not plain ASCII is bad input (one sentence, exit 2), never a
traceback or a key that an HTTP header cannot carry."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimictl.cli import main


@pytest.mark.parametrize(
    ("content", "sentence"),
    [
        (b"\xef\xbb\xbfsk-123\n", "starts with a UTF-8 byte-order mark, not plain ASCII text"),
        ("sk-123\n".encode("utf-16"), "starts with a UTF-16 byte-order mark, not plain ASCII"),
        (b"sk-\xff23\n", "holds byte 0xff at offset 3, which is not ASCII"),
        (b"sk-\x0123\n", "the key holds a control character"),
        (b"\n\n", "is empty; it must hold the key on its first line"),
    ],
)
@pytest.mark.parametrize("command", ["bench", "validate", "serve"])
def test_a_key_file_that_is_not_plain_ascii_is_bad_input(
    command: str,
    content: bytes,
    sentence: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = tmp_path / "key"
    key.write_bytes(content)
    where = {
        "bench": ["--target", "http://127.0.0.1:9"],
        "validate": ["--candidate", "http://127.0.0.1:9", "--reference", "http://127.0.0.1:9"],
        "serve": ["cpu-demo", "--dry-run"],
    }[command]
    code = main([command, *where, "--api-key-file", str(key)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: --api-key-file {key}") and sentence in err, err
    assert "kimictl bug" not in err and "Traceback" not in err


@pytest.fixture
def keyed_server():  # type: ignore[no-untyped-def]
    """A real HTTP server that answers every request 401, as vLLM started with --api-key does to
    a request without the right Bearer token."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuse(BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b'{"error": "Unauthorized"}'
            self.send_response(401)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _refuse

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--target", "{url}", "--num-prompts", "2"],  # /v1/models refused
        ["bench", "--target", "{url}", "--num-prompts", "2", "--model", "m"],  # every request
        ["validate", "--candidate", "{url}", "--reference", "{url}", "--checks", "greedy"],
    ],
)
@pytest.mark.parametrize("with_key", [False, True])
def test_http_401_names_the_key_not_the_server(
    args: list[str],
    with_key: bool,
    keyed_server: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("KIMICTL_STATE_DIR", str(tmp_path))
    if with_key:
        monkeypatch.setenv("VLLM_API_KEY", "wrong-key")
    else:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    code = main([a.replace("{url}", keyed_server) for a in args])
    err = capsys.readouterr().err
    assert code == 1, err
    hint = next(line for line in err.splitlines() if line.startswith("hint: "))
    wanted = "refused the key sent" if with_key else "the server wants an API key"
    assert wanted in hint and "VLLM_API_KEY" in hint and "--api-key-file" in hint, err
    assert "server is up" not in err
