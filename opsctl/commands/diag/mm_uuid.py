"""`opsctl diag mm-uuid`: which identifier each multimodal item reached the engine core with.

With ``--model`` (default tiny-vlm-multi) it starts the engine twice with the ``mm_uuid``
engine probe on (OPSCTL_PROBES=mm_uuid): once with prefix caching off and
``--mm-processor-cache-gb 0`` (the mode vLLM PR 56432 fixed) and once with both caches
on (the contrast: missing UUIDs get content hashes). With a URL it checks that one
engine, which must have been started by opsctl with the probe on (its run directory
holds the probe's events; found from the URL or given with --run-dir).

Four cases (all explicit; some explicit and some None; an empty string; none), then a
UUID reused for a different image. A case's items go out ``images_per_request(model)`` at
a time (a property of the served model: the catalog's ``images_per_prompt``, 1 for models
opsctl does not know); the probe's record for each request is found by its request id
only (no record: that item fails with "no engine record for request X"), and every item
it recorded is matched to the item sent at the same position.

tiny-vlm-multi (Idefics3) takes several images per prompt, so each case is ONE request:
the mixed case checks an explicit UUID at index 0 kept next to a request-local
``...-image-1`` at index 1 (vLLM PR 56432). tiny-vlm (BLIP-2) takes one image per prompt
(hard limit of its vLLM processor), so with it the mixed case goes as separate requests
and the report carries an info finding saying so (see opsctl.domain.mm_uuid).

Exit 1 when an explicit UUID is rewritten or a missing one does not get the expected
kind of id; 4 when the server does not answer within --timeout. Judgement lives in
opsctl.domain.mm_uuid.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from opsctl.commands.options import api_key_option, test_knob_option
from opsctl.errors import BadInput, CheckFailed, EngineUnreachable, OpsTimeout

SCHEMA = "diag.mm_uuid"
DEFAULT_MODEL = "tiny-vlm-multi"
CACHE_ARGS = {
    "caches-off": ["--no-enable-prefix-caching", "--mm-processor-cache-gb", "0"],
    "caches-on": ["--enable-prefix-caching", "--mm-processor-cache-gb", "4"],
}


def images_per_request(model: str) -> int:
    """Images one request carries for the served model ``model``: the catalog's
    ``images_per_prompt`` for an embedded model, else 1 (always accepted)."""
    from opsctl.embedded import catalog

    spec = catalog.CATALOG.get(model)
    return max(1, spec.images_per_prompt) if spec is not None else 1


def model_args(model: str) -> list[str]:
    """Engine arguments the model needs for the check (a multi-image limit)."""
    import json

    n = images_per_request(model)
    return ["--limit-mm-per-prompt", json.dumps({"image": n})] if n > 1 else []


def image_data_url(rgb: tuple[int, int, int], size: int = 28) -> str:
    import base64
    import io

    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), rgb)
    ImageDraw.Draw(img).rectangle(
        [size // 4, size // 4, size // 2, size // 2],
        fill=(255 - rgb[0], 255 - rgb[1], 255 - rgb[2]),
    )
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def probe_status(run_dir: Path) -> tuple[bool, str]:
    from opsctl.collectors.ledger import entries, read_records

    rows = [
        e
        for e in entries(read_records(run_dir))
        if e.name == "mm_uuid_probe" and e.role == "engine_core"
    ]
    if not rows:
        return False, "no engine-core ledger entry for mm_uuid_probe"
    last = rows[-1]
    return last.status == "applied", f"{last.status}: {last.detail}"


def engine_mode(run_dir: Path) -> tuple[str, dict]:
    from opsctl.collectors.ledger import read_events

    info = read_events(run_dir, "engine_info")
    if not info:
        return "unknown", {}
    last = info[-1]
    off = last.get("enable_prefix_caching") is False and last.get("mm_processor_cache_gb") in (
        0,
        0.0,
    )
    return ("caches-off" if off else "caches-on"), {
        "enable_prefix_caching": last.get("enable_prefix_caching"),
        "mm_processor_cache_gb": last.get("mm_processor_cache_gb"),
    }


class Sender:
    """Sends chat requests with one or more images and pairs each item with the probe's
    record of that request (by request id, item by position)."""

    def __init__(
        self, url: str, run_dir: Path, timeout: float = 120.0, api_key: str | None = None
    ) -> None:
        from opsctl.collectors import http

        self.url, self.run_dir, self.timeout, self.api_key = url, run_dir, timeout, api_key
        self.client = http.client(api_key, timeout=timeout)
        self.model = ""
        self.images: dict[str, str] = {}
        self.record_wait = 5.0  # seconds to wait for the probe's record after a reply

    def close(self) -> None:
        self.client.close()

    def _timeout(self, what: str) -> OpsTimeout:
        return OpsTimeout(
            f"{what} at {self.url} got no answer within {self.timeout:g} s",
            hint="raise --timeout if the engine is just slow",
        )

    def served_model(self) -> str:
        import httpx

        from opsctl.collectors import http

        try:
            r = http.check_auth(self.client.get(f"{self.url}/v1/models"), self.api_key)
            self.model = str(r.json()["data"][0]["id"])
        except httpx.TimeoutException:
            raise self._timeout("GET /v1/models") from None
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"GET /v1/models at {self.url} failed: {type(exc).__name__}"
            ) from None
        except (ValueError, KeyError, IndexError, TypeError):
            raise BadInput(
                f"{self.url}/v1/models returned no model; is this a vLLM server?"
            ) from None
        return self.model

    def _events(self) -> list[dict]:
        from opsctl.collectors.ledger import read_events

        return read_events(self.run_dir, "mm_uuid")

    def _part(self, item) -> dict:
        from opsctl.domain.mm_uuid import ABSENT, COLORS

        part: dict = {
            "type": "image_url",
            "image_url": {
                "url": self.images.setdefault(item.color, image_data_url(COLORS[item.color]))
            },
        }
        if item.uuid != ABSENT:
            part["uuid"] = item.uuid
        return part

    def record_for(self, rid: str | None, seen: int) -> dict | None:
        """The probe's record of request ``rid`` (the engine's id starts with the HTTP
        response id), among the events appended since ``seen``; None if none arrives."""
        if not rid:
            return None
        deadline = time.time() + self.record_wait
        while True:
            for e in self._events()[seen:]:
                if str(e.get("request_id", "")).startswith(rid):
                    return e
            if time.time() >= deadline:
                return None
            time.sleep(0.1)

    def send_request(self, mode: str, case: str, indexed: list) -> tuple[list, str]:
        """Send ``indexed`` [(index in the case, Item)] as ONE request; one Observation
        per item, matched to the probe's record by position."""
        import httpx

        from opsctl.collectors import http
        from opsctl.domain.mm_uuid import Observation

        body = {
            "model": self.model,
            "max_tokens": 4,
            "temperature": 0,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        *(self._part(item) for _, item in indexed),
                        {"type": "text", "text": "What is in the image?"},
                    ],
                }
            ],
        }
        seen = len(self._events())
        try:
            r = self.client.post(f"{self.url}/v1/chat/completions", json=body)
            http.check_auth(r, self.api_key)
        except httpx.TimeoutException:
            raise self._timeout("POST /v1/chat/completions") from None
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"POST /v1/chat/completions to {self.url} failed: {type(exc).__name__}"
            ) from None
        text, rid = None, None
        if r.status_code == 200:
            payload = r.json()
            rid = payload.get("id")
            text = payload["choices"][0]["message"].get("content")
        record = self.record_for(rid, seen) if r.status_code == 200 else None
        recorded = (record or {}).get("items") or []
        note = ""
        if r.status_code == 200 and record is None:
            note = f"no engine record for request {rid}"
        elif record is not None and "error" in record:
            note = f"the probe failed on request {rid}: {record['error']}"
        out = []
        for pos, (index, item) in enumerate(indexed):
            got = recorded[pos] if pos < len(recorded) else None
            out.append(
                Observation(
                    mode,
                    case,
                    index,
                    item.color,
                    item.sent_as,
                    item.uuid if item.explicit else None,
                    got.get("identifier") if got else None,
                    r.status_code,
                    text,
                    record.get("request_id") if record else None,
                    position=pos,
                    sent_items=len(indexed),
                    engine_items=len(recorded) if record is not None else None,
                    note=note or ("" if got else f"the engine record has no item #{pos}"),
                )
            )
        return out, (r.text[:300] if r.status_code != 200 else "")


def batches(items, per_request: int) -> list[list]:
    """[(index, item)] groups of at most ``per_request`` items, in order."""
    indexed = list(enumerate(items))
    return [indexed[i : i + per_request] for i in range(0, len(indexed), per_request)]


def run_mode(
    target,
    mode: str,
    prefix: str,
    emit,
    state: dict,
    timeout: float = 120.0,
    api_key: str | None = None,
) -> None:
    from opsctl.domain import mm_uuid as D

    sender = Sender(target.url, target.run_dir, timeout, api_key)
    try:
        per_request = images_per_request(sender.served_model())
        state["images_per_request"] = per_request
        for case in D.default_cases(prefix):
            for group in batches(case.items, per_request):
                obs_list, err = sender.send_request(mode, case.name, group)
                if obs_list[0].status == 400 and not state["observations"]:
                    raise BadInput(
                        f"the model at {target.url} rejected an image request: {err}",
                        hint=f"diag mm-uuid needs a vision-language model, e.g. --model {DEFAULT_MODEL}",
                    )
                for obs in obs_list:
                    state["observations"].append(obs)
                    state["events"].append(
                        f"[{mode}] {case.name} #{obs.index}: sent {obs.sent} -> "
                        f"{obs.identifier!r} ({obs.kind})"
                    )
                emit(
                    {
                        "phase": f"{mode}: {case.name}",
                        "columns": D.TABLE_COLUMNS,
                        "rows": D.table_rows(state["observations"]),
                        "events": state["events"][-len(obs_list) :],
                    }
                )
        reuse = D.reuse_case(prefix)
        for i, item in enumerate(reuse.items):
            # one request per item: the point is what a LATER request gets for the UUID
            (obs,), _ = sender.send_request(mode, reuse.name, [(i, item)])
            state["reuse"].append(obs)
            state["events"].append(
                f"[{mode}] reuse #{i}: {item.color} sent {obs.sent} -> {obs.identifier!r}, "
                f"output {obs.output!r}"
            )
            emit({"phase": f"{mode}: UUID reuse", "events": state["events"][-1:]})
    finally:
        sender.close()


def run_mm_uuid(
    url: str | None,
    model: str | None,
    run_dir: Path | None,
    prefix: str,
    modes: list[str],
    load_format: str,
    emit,
    timeout: float = 120.0,
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
    from opsctl.domain import mm_uuid as D
    from opsctl.domain.findings import verdict

    state: dict = {"observations": [], "reuse": [], "events": []}
    runs: list[dict] = []
    emit({"title": "diag mm-uuid", "phase": "starting", "columns": D.TABLE_COLUMNS, "rows": []})
    if url:
        with engine_target(url, None, api_key=api_key) as target:
            rd = run_dir or find_run_dir(target.url)
            if rd is None or not rd.is_dir():
                raise BadInput(
                    f"no opsctl run directory found for {target.url}",
                    hint="start the engine with opsctl (OPSCTL_PROBES=mm_uuid) or pass --run-dir",
                )
            applied, why = probe_status(rd)
            if not applied:
                raise BadInput(
                    f"the mm_uuid engine probe is not active on {target.url} ({why})",
                    hint="start the engine with OPSCTL_PROBES=mm_uuid in its environment",
                )
            mode, settings = engine_mode(rd)
            target.run_dir = rd
            if warn := knob_snapshot(rd):
                emit(warn)
            run_mode(target, mode, prefix, emit, state, timeout, api_key)
            runs.append(
                {
                    "mode": mode,
                    "url": target.url,
                    "run_dir": str(rd),
                    "settings": settings,
                    "engine_started": False,
                }
            )
    else:
        from opsctl.engine.model import resolve

        resolved = resolve(model)
        if resolved.archetype != "vision-language":
            raise BadInput(
                f"{resolved.name} is a {resolved.archetype} model; diag mm-uuid needs a "
                f"vision-language model (e.g. {DEFAULT_MODEL})"
            )
        for mode in modes:
            emit({"phase": f"starting engine ({mode})"})
            with engine_target(
                None,
                model,
                load_format=load_format,
                extra_args=CACHE_ARGS[mode] + model_args(resolved.name),
                env={"OPSCTL_PROBES": "mm_uuid"},
                knobs=knobs,
                label=f"diag-mm-uuid-{mode}",
            ) as target:
                if warn := knob_snapshot(target.run_dir):
                    emit(warn)
                applied, why = probe_status(target.run_dir)
                if not applied:
                    raise CheckFailed(f"the mm_uuid engine probe did not apply ({why})")
                seen_mode, settings = engine_mode(target.run_dir)
                run_mode(target, mode, prefix, emit, state, timeout)
                runs.append(
                    {
                        "mode": mode,
                        "url": target.url,
                        "run_dir": str(target.run_dir),
                        "settings": settings,
                        "engine_started": True,
                        "settings_mode": seen_mode,
                    }
                )
    findings = D.findings(state["observations"], state["reuse"])
    v = verdict(findings)
    emit(
        {
            "phase": "done",
            "verdict": v,
            "rows": D.table_rows(state["observations"]),
            "summary": f"{sum(D.judge_item(o)[0] == 'pass' for o in state['observations'])}/"
            f"{len(state['observations'])} items as expected",
        }
    )
    output.info(f"mm-uuid check: {v}")
    doc = output.document(
        SCHEMA,
        runs=runs,
        uuid_prefix=prefix,
        images_per_request=state.get("images_per_request", 1),
        items=[
            {**o.to_dict(), "verdict": D.judge_item(o)[0], "why": D.judge_item(o)[1]}
            for o in state["observations"]
        ],
        reuse=[o.to_dict() for o in state["reuse"]],
        findings=[f.to_dict() for f in findings],
        verdict=v,
    )
    return add_knob_warnings(doc, [r["run_dir"] for r in runs])


def render(doc: dict):
    def _render(console) -> None:
        from rich.markup import escape
        from rich.table import Table

        from opsctl.domain.mm_uuid import TABLE_COLUMNS, Observation, reuse_rows, table_rows

        def obs(d: dict) -> Observation:
            return Observation(**{k: d[k] for k in Observation.__slots__})  # type: ignore[attr-defined]

        t = Table(*TABLE_COLUMNS, title="identifier each image reached the engine core with")
        for cells in table_rows([obs(d) for d in doc["items"]]):
            v = cells[-1]
            cells = [escape(c) for c in cells]
            cells[-1] = f"[green]{v}[/]" if v == "PASS" else f"[red]{v}[/]"
            t.add_row(*cells)
        console.print(t)
        if doc["reuse"]:
            r = Table(*TABLE_COLUMNS[:-1], "output", title="one UUID reused for a different image")
            for cells in reuse_rows([obs(d) for d in doc["reuse"]]):
                r.add_row(*[escape(c) for c in cells])
            console.print(r)
        from opsctl.output import render_findings

        render_findings(console, doc["findings"], doc["verdict"])

    return _render


def register(app: typer.Typer) -> None:
    @app.command("mm-uuid")
    def mm_uuid(
        url: str | None = typer.Argument(
            None, help="base URL of an engine opsctl started with OPSCTL_PROBES=mm_uuid"
        ),
        model: str | None = typer.Option(
            None, "--model", help=f"start this vision-language model (default {DEFAULT_MODEL})"
        ),
        run_dir: Path | None = typer.Option(
            None, "--run-dir", help="run directory of the engine at URL"
        ),
        uuid_prefix: str = typer.Option(
            "opsctl", "--uuid-prefix", help="prefix of the explicit UUIDs sent"
        ),
        modes: str = typer.Option(
            "caches-off,caches-on",
            "--modes",
            help="with --model: which engines to start (caches-off, caches-on)",
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
            120.0, "--timeout", help="seconds to wait for each HTTP answer (exit 4 past it)"
        ),
        api_key: str | None = api_key_option(),
        test_knob: list[str] | None = test_knob_option(),
    ) -> None:
        """Show which multimodal identifier reached the engine core; exit 1 if an explicit UUID was rewritten."""
        from opsctl import output
        from opsctl.commands.diag.common import run_pipeline, warn_test_knobs
        from opsctl.commands.options import parse_knobs

        if url and model:
            raise BadInput("give either a URL or --model, not both")
        mode_list = [m.strip() for m in modes.split(",") if m.strip()]
        bad = [m for m in mode_list if m not in CACHE_ARGS]
        if bad or not mode_list:
            raise BadInput(f"--modes takes caches-off and/or caches-on, not {modes!r}")
        if load_format not in ("auto", "dummy", "safetensors"):
            raise BadInput(f"--load-format must be auto, safetensors or dummy, not {load_format!r}")
        if not uuid_prefix or any(c.isspace() for c in uuid_prefix):
            raise BadInput("--uuid-prefix must be a non-empty string without spaces")
        if run_dir is not None and not url:
            raise BadInput("--run-dir goes with a URL")
        if not timeout > 0:
            raise BadInput(f"--timeout must be positive, not {timeout}")
        knobs = parse_knobs(test_knob, url=url)
        model = model or (None if url else DEFAULT_MODEL)
        doc = run_pipeline(
            "diag mm-uuid",
            lambda emit: run_mm_uuid(
                url,
                model,
                run_dir,
                uuid_prefix,
                mode_list,
                load_format,
                emit,
                timeout,
                api_key=api_key,
                knobs=knobs,
            ),
            tui=tui,
            as_json=as_json,
        )
        warn_test_knobs(doc)
        output.emit(doc, as_json=as_json, render=render(doc))
        if doc["verdict"] != "pass":
            bad_items = [i for i in doc["items"] if i["verdict"] != "pass"]
            raise CheckFailed(
                f"{len(bad_items)} multimodal item(s) did not reach the engine core as expected"
            )
