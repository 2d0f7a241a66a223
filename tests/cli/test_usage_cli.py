"""CLI tests of `opsctl diag usage` (no engine): bad input, unreachable, and proof the
check can fail, using a stand-in HTTP server that reports inflated usage."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from opsctl.cli import app


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def toks(text: str, special: bool) -> list[str]:
    words = text.split()
    return ["[CLS]", *words, "[SEP]"] if special else words


@contextmanager
def stand_in(inflate: int = 0, score_status: int = 200) -> Iterator[str]:
    """A fake cross-encoder server: whitespace 'tokenizer'; usage = true count + inflate."""

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"data": [{"id": "fake-reranker", "root": None}]})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if self.path == "/tokenize":
                t = toks(body["prompt"], body.get("add_special_tokens", True))
                self._send(200, {"count": len(t), "tokens": list(range(len(t))), "token_strs": t})
            elif self.path == "/classify":
                self._send(200, {"data": []})
            elif self.path in ("/score", "/rerank"):
                if score_status != 200:
                    self._send(score_status, {"detail": "Not Found"})
                    return
                q = body.get("text_1", body.get("query"))
                d = body.get("text_2", body.get("documents"))
                qs = q if isinstance(q, list) else [q]
                ds = d if isinstance(d, list) else [d]
                if len(qs) == 1:
                    qs = qs * len(ds)
                n = (
                    sum(len(toks(f"{a} [SEP] {b}", True)) for a, b in zip(qs, ds, strict=True))
                    + inflate
                )
                usage = {"prompt_tokens": n, "total_tokens": n}
                if self.path == "/score":
                    self._send(
                        200,
                        {
                            "data": [{"index": i, "score": 0.5} for i in range(len(ds))],
                            "usage": usage,
                        },
                    )
                else:
                    top = body.get("top_n") or len(ds)
                    self._send(
                        200,
                        {
                            "results": [{"index": i, "relevance_score": 0.5} for i in range(top)],
                            "usage": usage,
                        },
                    )
            else:
                self._send(404, {"detail": "Not Found"})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_honest_stand_in_passes() -> None:
    with stand_in(inflate=0) as url:
        r = run("diag", "usage", url, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.diag.usage/1" and doc["verdict"] == "pass"
    assert doc["kind"] == "cross-encoder" and doc["kind_source"] == "/classify answers"
    assert doc["pair_separator"] == "[SEP]"
    assert len(doc["rows"]) == 8 and all(r["reported_prompt"] == r["expected"] for r in doc["rows"])


def test_inflated_usage_is_caught() -> None:
    with stand_in(inflate=1) as url:
        r = run("diag", "usage", url, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "fail"
    assert all(
        row["verdict"] == "fail" and row["reported_prompt"] == row["expected"] + 1
        for row in doc["rows"]
    )
    assert any(f["code"] == "usage.mismatch" for f in doc["findings"])
    assert "differ from the engine-input count" in r.stderr


def test_inflated_usage_rich_output() -> None:
    with stand_in(inflate=3) as url:
        r = run("diag", "usage", url)
    assert r.exit_code == 1
    assert "/rerank on cross-encoder" in r.stdout and "FAIL" in r.stdout and "off by +3" in r.stdout


def test_server_without_score_is_bad_input() -> None:
    with stand_in(score_status=404) as url:
        r = run("diag", "usage", url, "--kind", "cross-encoder")
    assert r.exit_code == 2
    assert "no /score endpoint" in r.stderr


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["not a url"], 2, "URL"),
        (["ftp://x"], 2, "http(s)"),
        (["http://127.0.0.1:9"], 3, "no server answered"),
        ([], 2, "--model"),
        (["http://127.0.0.1:9", "--model", "tiny-reranker"], 2, "not both"),
        (["--model", "tiny-llama"], 2, "decoder model"),
        (["--model", "no-such-model"], 2, "unknown embedded model"),
        (["--model", "tiny-reranker", "--kind", "llm"], 2, "--kind"),
        (["--model", "tiny-reranker", "--load-format", "gguf"], 2, "--load-format"),
    ],
)
def test_bad_input_and_unreachable(args, code, text) -> None:
    r = run("diag", "usage", *args)
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert text in r.stderr
    assert r.stdout == ""
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("opsctl: error")]) == 1


def test_tui_without_a_terminal_runs_plain() -> None:
    with stand_in() as url:
        r = run("diag", "usage", url, "--tui")
    assert r.exit_code == 0
    assert "needs a terminal" in r.stderr and "verdict: PASS" in r.stdout


def test_live_panel_shows_the_usage_table() -> None:
    """--tui feeds the same pipeline into the reusable DiagPanel."""
    import asyncio

    from opsctl.commands.diag.usage import run_usage
    from opsctl.ui.diag_app import DiagApp
    from opsctl.ui.panels.diag import DiagPanel

    async def go(url: str) -> tuple[dict, DiagApp]:
        app = DiagApp("diag usage", lambda emit: run_usage(url, None, None, "auto", emit))
        async with app.run_test(size=(160, 40)) as pilot:
            for _ in range(200):
                await pilot.pause(0.05)
                if app.done.is_set():
                    break
            await pilot.pause(0.1)
            return app.query_one(DiagPanel).last, app

    with stand_in(inflate=2) as url:
        last, app = asyncio.run(go(url))
    assert app.error is None and app.report is not None and app.report["verdict"] == "fail"
    assert last["verdict"] == "fail" and len(last["rows"]) == 8
    assert all(row[5] == "FAIL" for row in last["rows"])
