"""One grammar over every command of the CLI (docs/cli.md), checked by walking the Typer
app (console, certify and engram included): flag names from one vocabulary, a flag name
never carries two meanings, help on every option, an ``Examples:`` section and the exit
codes in every command's help, usage lines without Python types, summaries never cut,
and every duration flag taking ``30``, ``30s``, ``5m`` and refusing zero (unless the flag
says zero is allowed) and negative values with exit 2 before anything runs.

Commands of other work in progress that do not follow the grammar yet are listed in
PENDING with the rule they break; the rules themselves are never relaxed for them."""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict

import pytest
import typer
from typer.testing import CliRunner

from opsctl.cli import build_app

# "command path" -> rules it does not meet yet (empty when all commands follow the grammar)
PENDING: dict[str, set[str]] = {}

DURATION = "DURATION"
# the vocabulary (docs/cli.md): flag -> (what it must look like, why)
VOCABULARY = {
    "--json": "a plain flag (no value) printing one schema-versioned document",
    "--tui": "--tui/--no-tui",
    "--timeout": "a DURATION",
    "--api-key": "a KEY defaulting to $VLLM_API_KEY",
    "--run": "a RUN (run name or directory)",
    "--model": "an embedded model name or a model directory",
}


@functools.cache
def app():
    return build_app()


@functools.cache
def root():
    return typer.main.get_command(app())


def walk(cmd=None, path=()):
    cmd = cmd or root()
    subs = getattr(cmd, "commands", None)
    if subs:
        yield path, cmd
        for name, sub in subs.items():
            yield from walk(sub, (*path, name))
    else:
        yield path, cmd


def leaves():
    return [(" ".join(p), c) for p, c in walk() if not getattr(c, "commands", None)]


def groups():
    return [(" ".join(p), c) for p, c in walk() if getattr(c, "commands", None)]


def options(cmd):
    return [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]


def context(name: str, cmd):
    import click  # noqa: F401  (typer's own click objects are used below)

    return cmd.make_context(f"opsctl {name}", [], resilient_parsing=True)


def check(name: str, rule: str, ok: bool, detail: str) -> str | None:
    if ok:
        return None
    if rule in PENDING.get(name, set()):
        return None
    return f"{name}: {rule}: {detail}"


LEAVES = leaves()
IDS = [n for n, _ in LEAVES]


def test_the_walk_sees_every_command_group():
    names = {n.split()[0] for n, _ in LEAVES}
    assert {"serve", "status", "patches", "models", "runs", "diag", "console", "certify"} <= names
    assert {"engram", "version"} <= names
    assert len(LEAVES) >= 18


def test_pending_lists_only_real_commands():
    assert set(PENDING) <= set(IDS)


@pytest.mark.parametrize(("name", "cmd"), LEAVES, ids=IDS)
def test_every_option_has_help(name, cmd):
    bad = [max(p.opts, key=len) for p in options(cmd) if not (p.help or "").strip()]
    problem = check(name, "help", not bad, f"options without help: {bad}")
    assert problem is None, problem


@pytest.mark.parametrize(("name", "cmd"), [*LEAVES, ("", root())], ids=[*IDS, "opsctl"])
def test_help_has_examples_and_exit_codes(name, cmd):
    text = cmd.get_help(context(name, cmd))
    problem = check(
        name,
        "epilog",
        "Examples:\n" in text and "Exit codes: 0 ok" in text,
        "no Examples: section or no exit codes in --help (use options.epilog)",
    )
    assert problem is None, problem
    if "Examples:" in text:
        examples = text.split("Examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert 1 <= len(examples) <= 5 and all(e.strip().startswith("opsctl") for e in examples), (
            name,
            examples,
        )


def test_help_style_reads_only_what_every_typer_release_has():
    """opsctl's help style reads a parameter's click attributes alone (metavar, name,
    required, nargs): `serve --help` crashed on Typer 0.27.2 (the CUDA image's) when it
    read ``display_name_raw``, which only newer releases have."""
    from types import SimpleNamespace

    from opsctl.cli import _option_value_name, _plain_usage_pieces

    arg = SimpleNamespace(metavar=None, name="MODEL", required=False, nargs=1)
    assert _plain_usage_pieces(arg, None) == ["[MODEL]"]
    urls = SimpleNamespace(metavar="URL", name="urls", required=True, nargs=-1)
    assert _plain_usage_pieces(urls, None) == ["URL..."]
    port = SimpleNamespace(metavar=None, name="port", nargs=1)
    assert _option_value_name(port, None) == "PORT"


@pytest.mark.parametrize(("name", "cmd"), LEAVES, ids=IDS)
def test_usage_line_shows_no_python_types(name, cmd):
    usage = cmd.get_usage(context(name, cmd))
    for bad in ("{", "<list", "list[", "<str>", "<int>"):
        problem = check(name, "usage", bad not in usage, f"usage shows {bad!r}: {usage}")
        assert problem is None, problem


@pytest.mark.parametrize(("name", "cmd"), groups(), ids=[n or "opsctl" for n, _ in groups()])
def test_command_summaries_are_never_cut(name, cmd):
    text = cmd.get_help(context(name, cmd))
    listing = text.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    cut = [
        line.strip()
        for line in listing.splitlines()
        if line.rstrip().endswith("...")
        and "summary" not in PENDING.get(f"{name} {line.split()[0]}".strip(), set())
    ]
    assert cut == [], f"{name or 'opsctl'}: cut summaries (give short_help): {cut}"


def declared(cmd, param) -> inspect.Parameter:
    """The command function's own declaration of a parameter: its annotation and its
    ``typer.Option`` (public in every Typer release, unlike the parameter's internals)."""
    return inspect.signature(cmd.callback).parameters[param.name]


def meaning(cmd, param) -> tuple:
    """What a flag name stands for: its value kind (a plain flag, a DURATION, an int, a
    path, text...) and whether it repeats. One name, one meaning across commands."""
    if param.is_flag and not param.secondary_opts:
        return ("flag",)
    if param.secondary_opts:
        return ("on/off", tuple(param.secondary_opts))
    if param.metavar == DURATION:
        return (DURATION,)
    declared_as = declared(cmd, param).annotation  # a string, a class or a typing form
    annotation = declared_as.__name__ if isinstance(declared_as, type) else str(declared_as)
    annotation = annotation.removesuffix(" | None")
    kind = annotation.removeprefix("list[").removesuffix("]")
    # a name, a path, a format: text; a count or a tolerance: a number
    kind = {"int": "number", "float": "number", "Path": "text", "str": "text"}.get(kind, kind)
    return (kind, bool(param.multiple))


def test_a_flag_name_has_one_meaning_across_commands():
    seen: dict[str, dict[tuple, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, cmd in LEAVES:
        for p in options(cmd):
            for opt in p.opts:
                seen[opt][meaning(cmd, p)].append(name)
    clashes = {
        opt: {str(k): v for k, v in kinds.items()}
        for opt, kinds in seen.items()
        if len(kinds) > 1
        and not all(n in PENDING and "vocabulary" in PENDING[n] for v in kinds.values() for n in v)
    }
    assert clashes == {}, clashes


@pytest.mark.parametrize(("name", "cmd"), LEAVES, ids=IDS)
def test_vocabulary_flags_look_the_same_everywhere(name, cmd):
    problems = []
    for p in options(cmd):
        opts = set(p.opts)
        if "--json" in opts and not (p.is_flag and not p.secondary_opts):
            problems.append("--json must be a plain flag")
        if "--tui" in opts and p.secondary_opts != ["--no-tui"]:
            problems.append("--tui must be --tui/--no-tui (tui_option)")
        if "--timeout" in opts and p.metavar != DURATION:
            problems.append("--timeout must be a DURATION (duration_option)")
        if "--api-key" in opts and p.envvar != "VLLM_API_KEY":
            problems.append("--api-key must default to $VLLM_API_KEY")
        if "--run" in opts and p.metavar != "RUN":
            problems.append("--run takes RUN")
        if opts & {"--run-dir", "--modes"}:
            problems.append(
                f"{sorted(opts)}: old names, hidden aliases at most (use --run, --mode)"
            )
    for p in cmd.params:
        if p.param_type_name == "argument" and p.name in ("url", "urls"):  # noqa: SIM102
            if p.metavar not in ("URL", "URL..."):
                problems.append(f"the {p.name} positional shows as {p.metavar!r}, not URL")
    problem = check(name, "vocabulary", not problems, "; ".join(problems))
    assert problem is None, problem


def duration_flags():
    for name, cmd in LEAVES:
        for p in options(cmd):
            if p.metavar == DURATION:
                yield name, cmd, p


DURATIONS = list(duration_flags())


def allows_zero(cmd, param) -> bool:
    parser = declared(cmd, param).default.parser
    return bool(getattr(parser, "keywords", {}).get("allow_zero"))


def test_duration_flags_exist_on_every_command_that_waits():
    names = {(n, max(p.opts, key=len)) for n, _, p in DURATIONS}
    for must in [("serve", "--timeout"), ("status", "--timeout"), ("diag usage", "--timeout"),
                 ("diag invariance", "--timeout"), ("diag mm-uuid", "--timeout"),
                 ("diag kv-fail", "--timeout"), ("diag lora", "--timeout"),
                 ("runs clean", "--older-than"), ("runs clean", "--min-age")]:  # fmt: skip
        assert must in names, must


@pytest.mark.parametrize(
    ("name", "cmd", "param"),
    DURATIONS,
    ids=[f"{n} {max(p.opts, key=len)}" for n, _, p in DURATIONS],
)
def test_duration_flags_take_30_30s_5m_and_refuse_zero_and_negative(name, cmd, param):
    ctx = context(name, cmd)
    for text, seconds in (("30", 30.0), ("30s", 30.0), ("5m", 300.0), ("1.5", 1.5)):
        assert param.process_value(ctx, text) == seconds, (name, text)
    flag = max(param.opts, key=len)
    bad = ["-1", "-5m", "soon"] + ([] if allows_zero(cmd, param) else ["0", "0s"])
    for value in bad:
        # the flag comes first: click converts it before it looks at anything else, so
        # nothing runs (no engine, no request) and a missing URL does not matter
        r = CliRunner().invoke(app(), [*name.split(), f"{flag}={value}"])
        lines = r.stderr.splitlines()
        assert r.exit_code == 2, (name, flag, value, r.stdout, r.stderr)
        assert lines[0].startswith(f"opsctl: error: {flag}: "), (name, value, lines)
        assert len(lines) <= 2 and r.stdout == "", (name, value, r.stdout, r.stderr)
