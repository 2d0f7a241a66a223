"""`opsctl diag usage`: verify /score and /rerank ``usage`` against an independent count.

Sends /score and /rerank requests (one and several documents, N:N text pairs, a long
document, top_n) and compares ``usage.prompt_tokens`` / ``total_tokens`` with the token
counts of the exact engine inputs. Where they come from:

- the model directory is readable here (the server's /v1/models ``root``, or --model):
  the model's own tokenizer, called as vLLM's scoring io_processor calls it
  (``tokenizer(text=q, text_pair=d)`` for a cross-encoder, ``tokenizer(text)`` for a
  bi-encoder) is the expected count; the server's /tokenize is the cross-check;
- otherwise the server's /tokenize: each text alone; for pairs the template is inferred
  from the special tokens /tokenize adds around one text (BERT ``[CLS] q [SEP] d [SEP]``,
  RoBERTa/XLM-R ``<s> q </s></s> d </s>``). An unknown template makes the rows
  "unverified" (verdict "unverified", exit 0, a warning on stderr), never a mismatch.

Exit 1 on any mismatch, 2 for bad input or a generative model, 3 unreachable, 4 when the
server does not answer within --timeout. The comparison lives in opsctl.domain.usage.
"""

from __future__ import annotations

import typer

from opsctl.commands.options import api_key_option, test_knob_option
from opsctl.errors import BadInput, CheckFailed, EngineUnreachable, OpsTimeout

SCHEMA = "diag.usage"


class Api:
    """The few HTTP calls diag usage makes (I/O only)."""

    def __init__(self, url: str, timeout: float = 60.0, api_key: str | None = None) -> None:
        from opsctl.collectors import http

        self.url, self.timeout, self.api_key = url, timeout, api_key
        self.client = http.client(api_key, timeout=timeout)
        self.model = ""

    def close(self) -> None:
        self.client.close()

    def _post(self, path: str, body: dict):
        import httpx

        from opsctl.collectors import http

        try:
            return http.check_auth(self.client.post(f"{self.url}{path}", json=body), self.api_key)
        except httpx.TimeoutException:
            raise OpsTimeout(
                f"POST {path} to {self.url} got no answer within {self.timeout:g} s",
                hint="raise --timeout if the server is just slow",
            ) from None
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"POST {path} to {self.url} failed: {type(exc).__name__}: {exc}"
            ) from None

    def served_model(self) -> tuple[str, str | None]:
        import httpx

        from opsctl.collectors import http

        try:
            r = http.check_auth(self.client.get(f"{self.url}/v1/models"), self.api_key)
        except httpx.TimeoutException:
            raise OpsTimeout(
                f"GET /v1/models at {self.url} got no answer within {self.timeout:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"GET /v1/models at {self.url} failed: {type(exc).__name__}"
            ) from None
        if r.status_code != 200:
            raise BadInput(
                f"{self.url}/v1/models answered HTTP {r.status_code}; is this a vLLM server?"
            )
        try:
            data = r.json()["data"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise BadInput(f"{self.url}/v1/models returned no model") from None
        self.model = str(data.get("id"))
        return self.model, data.get("root")

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[str]:
        r = self._post(
            "/tokenize",
            {
                "model": self.model,
                "prompt": text,
                "add_special_tokens": add_special_tokens,
                "return_token_strs": True,
            },
        )
        if r.status_code != 200:
            raise CheckFailed(f"/tokenize answered HTTP {r.status_code}: {r.text[:200]}")
        body = r.json()
        strs = body.get("token_strs") or [str(t) for t in body.get("tokens", [])]
        if len(strs) != len(body.get("tokens", strs)):
            raise CheckFailed("/tokenize returned token_strs and tokens of different lengths")
        return list(strs)

    def call(self, endpoint: str, body: dict) -> tuple[int, dict]:
        r = self._post(f"/{endpoint}", body)
        try:
            payload = r.json()
        except ValueError:
            payload = {"raw": r.text[:300]}
        return r.status_code, payload if isinstance(payload, dict) else {"raw": payload}

    def supports(self, path: str, body: dict) -> bool:
        return self._post(path, body).status_code == 200


def detect_kind(
    api: Api, root: str | None, given: str | None, archetype: str | None
) -> tuple[str, str]:
    """(kind, how it was determined)."""
    import json
    from pathlib import Path

    from opsctl.domain.usage import BI, CROSS, KINDS
    from opsctl.engine.model import archetype_of

    if given:
        return given, "--kind"
    if archetype in KINDS:
        return archetype, "embedded model archetype"
    if root and (Path(root) / "config.json").is_file():
        try:
            arch = archetype_of(json.loads((Path(root) / "config.json").read_text()))
        except (OSError, ValueError):
            arch = ""
        if arch in KINDS:
            return arch, f"config.json under {root}"
        if arch:
            raise BadInput(
                f"the model at {api.url} is a {arch} model; diag usage needs a cross-encoder "
                "or a bi-encoder (a model serving /score and /rerank)"
            )
    if api.supports("/v1/embeddings", {"model": api.model, "input": "probe"}):
        return BI, "/v1/embeddings answers"
    if api.supports("/classify", {"model": api.model, "input": "probe"}):
        return CROSS, "/classify answers"
    raise BadInput(
        f"cannot tell whether the model at {api.url} is a cross- or bi-encoder",
        hint="pass --kind cross-encoder or --kind bi-encoder",
    )


def local_tokenizer(path: str | None):
    """The model's own tokenizer when its directory (or a local HF cache) is readable here,
    loaded as vLLM loads it (AutoTokenizer); None otherwise."""
    from pathlib import Path

    if not path:
        return None
    p = Path(path)
    if (
        p.exists()
        and not (p / "tokenizer_config.json").is_file()
        and not (p / "tokenizer.json").is_file()
    ):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception:  # not readable here: /tokenize stays the source
        return None


def tokenize_counter(api: Api, kind: str):
    """count(input) from the server's /tokenize; (count, template or None, method)."""
    from opsctl.domain.usage import CROSS, pair_template, special_affixes

    template = None
    if kind == CROSS:
        probe = "hello world"
        try:
            prefix, suffix = special_affixes(api.tokenize(probe, True), api.tokenize(probe, False))
        except ValueError:
            prefix, suffix = [], []
        template = pair_template(prefix, suffix)

    def count(x) -> int | None:
        if isinstance(x, tuple):
            if template is None:
                return None
            return template.count(len(api.tokenize(x[0], False)), len(api.tokenize(x[1], False)))
        return len(api.tokenize(x, True))

    if kind != CROSS:
        method = "/tokenize of each text"
    elif template is None:
        method = "/tokenize (pair template unknown)"
    else:
        method = f"/tokenize of q and d + {template.name}"
    return count, template, method


def make_counters(api: Api, kind: str, model_dir: str | None):
    """(count, cross_count, method, template, source): the local tokenizer is the primary
    count when readable, /tokenize (with an inferred pair template) the cross-check."""
    from opsctl.domain.usage import CROSS

    remote, template, remote_method = tokenize_counter(api, kind)
    tok = local_tokenizer(model_dir)
    if tok is None:
        return remote, None, remote_method, template, "/tokenize"

    def local(x) -> int:
        # exactly vLLM's call (scoring io_processor: tokenizer(text=, text_pair=));
        # a bi-encoder input is one text with special tokens
        if isinstance(x, tuple):
            return len(tok(text=x[0], text_pair=x[1])["input_ids"])
        return len(tok(x)["input_ids"])

    call = "tokenizer(text=q, text_pair=d)" if kind == CROSS else "tokenizer(text)"
    method = f"local {call} from {model_dir}"
    return local, remote, method, template, "local tokenizer"


def run_usage(
    url: str | None,
    model: str | None,
    kind: str | None,
    load_format: str,
    emit,
    timeout: float = 60.0,
    *,
    api_key: str | None = None,
    knobs: dict[str, str] | None = None,
) -> dict:
    from opsctl import output
    from opsctl.commands.diag.common import (
        add_knob_warnings,
        engine_target,
        find_run_dir,
        knob_snapshot,
    )
    from opsctl.domain import usage as U
    from opsctl.domain.findings import Finding

    archetype = None
    model_dir: str | None = None
    if model:
        from opsctl.engine.model import resolve

        resolved = resolve(model)
        archetype = resolved.archetype
        model_dir = str(resolved.path)
        if archetype not in U.KINDS:
            raise BadInput(
                f"{resolved.name} is a {archetype} model; diag usage needs a cross-encoder or a "
                "bi-encoder (e.g. tiny-reranker, tiny-embed)"
            )
    emit(
        {
            "title": "diag usage",
            "phase": "starting engine" if model else f"checking {url}",
            "columns": U.TABLE_COLUMNS,
            "rows": [],
        }
    )
    with engine_target(
        url, model, load_format=load_format, label="diag-usage", knobs=knobs, api_key=api_key
    ) as target:
        run_dir = target.run_dir or find_run_dir(target.url)
        if warn := knob_snapshot(run_dir):
            emit(warn)
        api = Api(target.url, timeout, api_key)
        try:
            name, root = api.served_model()
            kind_, kind_how = detect_kind(api, root, kind, archetype)
            status, payload = api.call("score", U.default_cases()[0].body(name))
            if status == 404:
                raise BadInput(
                    f"{target.url} has no /score endpoint; is it serving a generative model?",
                    hint="diag usage needs a cross-encoder or bi-encoder",
                )
            if status != 200:
                raise BadInput(
                    f"/score on {target.url} answered HTTP {status}: {str(payload)[:200]}",
                    hint="diag usage needs a model that serves /score and /rerank",
                )
            count, cross, method, template, source = make_counters(api, kind_, model_dir or root)
            sample = api.tokenize("the capital of france", False)
            unk = sum(1 for t in sample if "unk" in t.lower())
            rows: list[U.UsageRow] = []
            events = [f"model {name}: {kind_} ({kind_how}); expected counts from {method}"]
            for case in U.default_cases():
                status, payload = api.call(case.endpoint, case.body(name))
                if status != 200:
                    raise CheckFailed(
                        f"/{case.endpoint} '{case.name}' answered HTTP {status}: {str(payload)[:200]}"
                    )
                results = (
                    payload.get("data") if case.endpoint == "score" else payload.get("results")
                )
                row = U.compare(
                    kind_,
                    case,
                    payload.get("usage"),
                    count,
                    method=method,
                    cross_count=cross,
                    results=len(results) if isinstance(results, list) else None,
                )
                rows.append(row)
                events.append(
                    f"{row.endpoint} {case.name}: reported {row.reported_prompt}, expected "
                    f"{row.expected} -> {row.verdict}"
                )
                emit(
                    {
                        "phase": f"{len(rows)}/{len(U.default_cases())} requests",
                        "columns": U.TABLE_COLUMNS,
                        "rows": U.table_rows(rows),
                        "events": events[-1:] if len(rows) > 1 else events,
                    }
                )
        finally:
            api.close()
        findings = U.findings(rows)
        if unk == len(sample):
            findings.append(
                Finding(
                    "warning",
                    "usage.all_unk",
                    "the tokenizer maps a plain sentence to [UNK] only",
                    {},
                )
            )
        report = U.UsageReport(kind_, name, target.url, tuple(rows), tuple(findings))
        verdict = report.verdict
        n_pass = sum(r.verdict == "pass" for r in rows)
        emit(
            {
                "phase": "done",
                "verdict": verdict,
                "rows": U.table_rows(rows),
                "summary": f"{n_pass}/{len(rows)} match"
                + (
                    f", {sum(r.verdict == 'unverified' for r in rows)} unverified"
                    if verdict == "unverified"
                    else ""
                ),
            }
        )
        output.info(f"usage check on {name} ({kind_}): {verdict}")
        doc = output.document(
            SCHEMA,
            url=target.url,
            model=name,
            kind=kind_,
            kind_source=kind_how,
            engine_started=not target.external,
            run_dir=str(target.run_dir) if target.run_dir else None,
            pair_separator=(template.suffix[0] if template and template.suffix else None),
            pair_template=template.name if template else None,
            expected_method=method,
            expected_source=source,
            local_cross_check=source == "local tokenizer",
            rows=[r.to_dict() for r in rows],
            findings=[f.to_dict() for f in findings],
            verdict=verdict,
        )
        return add_knob_warnings(doc, [run_dir])


def render(doc: dict):
    def _render(console) -> None:
        from rich.markup import escape
        from rich.table import Table

        from opsctl.domain.usage import TABLE_COLUMNS, UsageRow, table_rows

        rows = [UsageRow(**{**r, "parts": tuple(r["parts"])}) for r in doc["rows"]]
        for endpoint in dict.fromkeys(r.endpoint for r in rows):
            t = Table(*TABLE_COLUMNS[2:], title=f"{endpoint} on {doc['kind']} ({doc['model']})")
            for r, cells in zip(rows, table_rows(rows), strict=True):
                if r.endpoint == endpoint:
                    v = cells[5]
                    cells = [escape(c) for c in cells]
                    colour = {"PASS": "green", "UNVERIFIED": "yellow"}.get(v, "red")
                    cells[5] = f"[{colour}]{v}[/]"
                    t.add_row(*cells[2:])
            console.print(t)
        from opsctl.output import render_findings

        render_findings(console, doc["findings"], doc["verdict"])

    return _render


def register(app: typer.Typer) -> None:
    @app.command("usage")
    def usage(
        url: str | None = typer.Argument(
            None, help="base URL of a running vLLM server (or use --model)"
        ),
        model: str | None = typer.Option(
            None, "--model", help="start this model (embedded name or directory)"
        ),
        kind: str | None = typer.Option(
            None, "--kind", help="cross-encoder | bi-encoder (default: detect)"
        ),
        load_format: str = typer.Option(
            "auto", "--load-format", help="auto (real weights) or dummy"
        ),
        as_json: bool = typer.Option(
            False, "--json", help="print the schema-versioned JSON report"
        ),
        tui: bool | None = typer.Option(
            None, "--tui/--no-tui", help="show a live panel while it runs"
        ),
        timeout: float = typer.Option(
            60.0, "--timeout", help="seconds to wait for each HTTP answer (exit 4 past it)"
        ),
        api_key: str | None = api_key_option(),
        test_knob: list[str] | None = test_knob_option(),
    ) -> None:
        """Check /score and /rerank usage.prompt_tokens against the engine inputs.

        Exit 1 on a mismatch; verdict "unverified" (exit 0, warning) when the expected
        count cannot be derived."""
        from opsctl import output
        from opsctl.commands.diag.common import run_pipeline, warn_test_knobs
        from opsctl.commands.options import parse_knobs
        from opsctl.domain.usage import KINDS

        if kind is not None and kind not in KINDS:
            raise BadInput(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if load_format not in ("auto", "dummy", "safetensors"):
            raise BadInput(f"--load-format must be auto, safetensors or dummy, not {load_format!r}")
        if not url and not model:
            raise BadInput(
                "give a server URL or --model NAME",
                hint="e.g. opsctl diag usage --model tiny-reranker",
            )
        if url and model:
            raise BadInput("give either a URL or --model, not both")
        if not timeout > 0:
            raise BadInput(f"--timeout must be positive, not {timeout}")
        knobs = parse_knobs(test_knob, url=url)
        doc = run_pipeline(
            "diag usage",
            lambda emit: run_usage(
                url, model, kind, load_format, emit, timeout, api_key=api_key, knobs=knobs
            ),
            tui=tui,
            as_json=as_json,
        )
        warn_test_knobs(doc)
        output.emit(doc, as_json=as_json, render=render(doc))
        if doc["verdict"] == "unverified":
            n = sum(r["verdict"] == "unverified" for r in doc["rows"])
            output.warn(
                f"usage NOT verified for {n} of {len(doc['rows'])} request(s): the expected "
                "count could not be derived (unknown pair template); not a mismatch"
            )
            return
        if doc["verdict"] != "pass":
            bad = sum(r["verdict"] == "fail" for r in doc["rows"])
            raise CheckFailed(
                f"{bad} of {len(doc['rows'])} usage report(s) differ from the engine-input count"
            )
