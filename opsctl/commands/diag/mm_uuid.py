"""`opsctl diag mm-uuid`: which identifier each multimodal item reached the engine core with.

With ``--model`` (default tiny-vlm) it starts the engine twice with the ``mm_uuid``
engine probe on (OPSCTL_PROBES=mm_uuid): once with prefix caching off and
``--mm-processor-cache-gb 0`` (the mode vLLM PR 56432 fixed) and once with both caches
on (the contrast: missing UUIDs get content hashes). With a URL it checks that one
engine, which must have been started by opsctl with the probe on (its run directory
holds the probe's events; found from the URL or given with --run-dir).

Four cases (all explicit; some explicit and some None; an empty string; none), then a
UUID reused for a different image. Exit 1 when an explicit UUID is rewritten or a missing
one does not get the expected kind of id. Judgement lives in opsctl.domain.mm_uuid.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from opsctl.errors import BadInput, CheckFailed, EngineUnreachable

SCHEMA = "diag.mm_uuid"
CACHE_ARGS = {
    "caches-off": ["--no-enable-prefix-caching", "--mm-processor-cache-gb", "0"],
    "caches-on": ["--enable-prefix-caching", "--mm-processor-cache-gb", "4"],
}


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


def find_run_dir(url: str) -> Path | None:
    """The run directory of a live engine opsctl started at ``url`` (newest first)."""
    from opsctl import paths

    candidates = []
    for meta in paths.runs_dir().glob("*/meta.json"):
        try:
            m = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if str(m.get("url", "")).rstrip("/") == url.rstrip("/") and not m.get("stopped_at"):
            candidates.append((m.get("started_at") or 0, meta.parent))
    return max(candidates)[1] if candidates else None


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
    """Sends one chat request per item and pairs it with the probe's record."""

    def __init__(self, url: str, run_dir: Path, timeout: float = 120.0) -> None:
        import httpx

        self.url, self.run_dir = url, run_dir
        self.client = httpx.Client(timeout=timeout)
        self.model = ""
        self.images: dict[str, str] = {}

    def close(self) -> None:
        self.client.close()

    def served_model(self) -> str:
        import httpx

        try:
            r = self.client.get(f"{self.url}/v1/models")
            self.model = str(r.json()["data"][0]["id"])
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

    def send(self, mode: str, case: str, index: int, item):
        import httpx

        from opsctl.domain.mm_uuid import ABSENT, COLORS, Observation

        part: dict = {
            "type": "image_url",
            "image_url": {
                "url": self.images.setdefault(item.color, image_data_url(COLORS[item.color]))
            },
        }
        if item.uuid != ABSENT:
            part["uuid"] = item.uuid
        body = {
            "model": self.model,
            "max_tokens": 4,
            "temperature": 0,
            "messages": [
                {
                    "role": "user",
                    "content": [part, {"type": "text", "text": "What is in the image?"}],
                }
            ],
        }
        seen = len(self._events())
        try:
            r = self.client.post(f"{self.url}/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"POST /v1/chat/completions to {self.url} failed: {type(exc).__name__}"
            ) from None
        text, rid = None, None
        if r.status_code == 200:
            payload = r.json()
            rid = payload.get("id")
            text = payload["choices"][0]["message"].get("content")
        identifier, engine_rid = None, None
        deadline = time.time() + 5
        while r.status_code == 200 and time.time() < deadline:
            new = self._events()[seen:]
            match = [e for e in new if rid and str(e.get("request_id", "")).startswith(rid)] or new
            if match:
                items = match[0].get("items") or []
                engine_rid = match[0].get("request_id")
                identifier = items[0].get("identifier") if items else None
                break
            time.sleep(0.1)
        explicit = item.uuid if item.explicit else None
        obs = Observation(
            mode,
            case,
            index,
            item.color,
            item.sent_as,
            explicit,
            identifier,
            r.status_code,
            text,
            engine_rid,
        )
        return obs, (r.text[:300] if r.status_code != 200 else "")


def run_mode(target, mode: str, prefix: str, emit, state: dict) -> None:
    from opsctl.domain import mm_uuid as D

    sender = Sender(target.url, target.run_dir)
    try:
        sender.served_model()
        for case in D.default_cases(prefix):
            for i, item in enumerate(case.items):
                obs, err = sender.send(mode, case.name, i, item)
                if obs.status == 400 and not state["observations"]:
                    raise BadInput(
                        f"the model at {target.url} rejected an image request: {err}",
                        hint="diag mm-uuid needs a vision-language model, e.g. --model tiny-vlm",
                    )
                state["observations"].append(obs)
                state["events"].append(
                    f"[{mode}] {case.name} #{i}: sent {obs.sent} -> {obs.identifier!r} ({obs.kind})"
                )
                emit(
                    {
                        "phase": f"{mode}: {case.name}",
                        "columns": D.TABLE_COLUMNS,
                        "rows": D.table_rows(state["observations"]),
                        "events": state["events"][-1:],
                    }
                )
        reuse = D.reuse_case(prefix)
        for i, item in enumerate(reuse.items):
            obs, _ = sender.send(mode, reuse.name, i, item)
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
) -> dict:
    from opsctl import output
    from opsctl.commands.diag.common import engine_target
    from opsctl.domain import mm_uuid as D
    from opsctl.domain.findings import verdict

    state: dict = {"observations": [], "reuse": [], "events": []}
    runs: list[dict] = []
    emit({"title": "diag mm-uuid", "phase": "starting", "columns": D.TABLE_COLUMNS, "rows": []})
    if url:
        with engine_target(url, None) as target:
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
            run_mode(target, mode, prefix, emit, state)
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
                "vision-language model (e.g. tiny-vlm)"
            )
        for mode in modes:
            emit({"phase": f"starting engine ({mode})"})
            with engine_target(
                None,
                model,
                load_format=load_format,
                extra_args=CACHE_ARGS[mode],
                env={"OPSCTL_PROBES": "mm_uuid"},
                label=f"diag-mm-uuid-{mode}",
            ) as target:
                applied, why = probe_status(target.run_dir)
                if not applied:
                    raise CheckFailed(f"the mm_uuid engine probe did not apply ({why})")
                seen_mode, settings = engine_mode(target.run_dir)
                run_mode(target, mode, prefix, emit, state)
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
    return output.document(
        SCHEMA,
        runs=runs,
        uuid_prefix=prefix,
        items=[
            {**o.to_dict(), "verdict": D.judge_item(o)[0], "why": D.judge_item(o)[1]}
            for o in state["observations"]
        ],
        reuse=[o.to_dict() for o in state["reuse"]],
        findings=[f.to_dict() for f in findings],
        verdict=v,
    )


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
        for f in doc["findings"]:
            console.print(f"{f['severity']:>7}  {escape(f['message'])}", highlight=False)
        colour = "green" if doc["verdict"] == "pass" else "red"
        console.print(f"verdict: [b {colour}]{doc['verdict'].upper()}[/]")

    return _render


def register(app: typer.Typer) -> None:
    @app.command("mm-uuid")
    def mm_uuid(
        url: str | None = typer.Argument(
            None, help="base URL of an engine opsctl started with OPSCTL_PROBES=mm_uuid"
        ),
        model: str | None = typer.Option(
            None, "--model", help="start this vision-language model (default tiny-vlm)"
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
    ) -> None:
        """Show which multimodal identifier reached the engine core; exit 1 if an explicit UUID was rewritten."""
        from opsctl import output
        from opsctl.commands.diag.common import run_pipeline

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
        model = model or (None if url else "tiny-vlm")
        doc = run_pipeline(
            "diag mm-uuid",
            lambda emit: run_mm_uuid(
                url, model, run_dir, uuid_prefix, mode_list, load_format, emit
            ),
            tui=tui,
            as_json=as_json,
        )
        output.emit(doc, as_json=as_json, render=render(doc))
        if doc["verdict"] != "pass":
            bad_items = [i for i in doc["items"] if i["verdict"] != "pass"]
            raise CheckFailed(
                f"{len(bad_items)} multimodal item(s) did not reach the engine core as expected"
            )
