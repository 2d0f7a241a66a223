"""A targeted tokenizer for the /metrics sample lines the console reads.

prometheus_client's parser (opsctl.domain.metrics.parse_samples, the reference) walks
every label set character by character in Python; at 1 Hz over many endpoints with
changing counters that was most of the console's CPU. The console reads a few families
(metrics._WANTED), whose sample lines vLLM writes in the plain form

    name{label="value",...} value [timestamp]

This module splits such lines with str.find/str.split (no regex, one pass over the
body) and builds the same MetricSamples as the reference. Anything it does not fully
understand (an escape in a label value, a quoted or unusual name, a duplicate label,
more than value and timestamp, a value the reference would refuse) makes it hand the
whole body to prometheus_client's parser instead, so the numbers are the reference's
by construction or by fallback. tests/unit/test_metrics_fast.py proves the equality
on recorded real vLLM bodies.
"""

from __future__ import annotations

from opsctl.domain.metrics import (
    _WANTED,
    CACHE_CONFIG_INFO,
    ENGINE_LABEL,
    LABELLED,
    PER_ENGINE,
    RUNNING,
    MetricSamples,
    Sums,
    parse_samples,
)

BUCKET, INFO, VALUE = 0, 1, 2
# a prepared sample: what build_samples works out per line, done once per distinct line
Prepared = tuple[int, str, object, float, dict[str, str]]


class Unsupported(ValueError):
    """A line this tokenizer does not handle: the caller falls back to the reference."""


def _name_ok(name: str) -> bool:
    # legacy Prometheus metric name: [a-zA-Z_:][a-zA-Z0-9_:]*
    return name.isascii() and name.replace(":", "_").isidentifier()


def _label_ok(name: str) -> bool:
    return name.isascii() and name.isidentifier() and name != "__name__"


def _value(rest: str) -> float:
    parts = rest.split()
    if not 1 <= len(parts) <= 2 or "_" in parts[0]:
        raise Unsupported(rest)
    return float(parts[0])  # ValueError for a value the reference refuses too


def tokenize(line: str) -> tuple[str, dict[str, str], float]:
    """(name, labels, value) of one sample line; Unsupported when not the plain form."""
    if "\\" in line:
        raise Unsupported(line)
    brace = line.find("{")
    if brace < 0:
        name, _, rest = line.partition(" ")
        if not rest or not _name_ok(name):
            raise Unsupported(line)
        return name, {}, _value(rest)
    name = line[:brace]
    if not _name_ok(name):
        raise Unsupported(line)
    labels: dict[str, str] = {}
    i = brace + 1
    while line[i : i + 1] != "}":
        eq = line.find('="', i)
        close = line.find('"', eq + 2) if eq >= 0 else -1
        if close < 0:
            raise Unsupported(line)
        key = line[i:eq]
        if not _label_ok(key) or key in labels:
            raise Unsupported(line)
        labels[key] = line[eq + 2 : close]
        i = close + 1
        sep = line[i : i + 1]
        if sep == ",":
            i += 1
        elif sep != "}":
            raise Unsupported(line)
    return name, labels, _value(line[i + 1 :])


def scan(text: str) -> tuple[list[str], int]:
    """One pass over a body: the wanted sample lines and the count of vllm:* lines.

    The wanted test is metrics.wanted, inlined."""
    keep: list[str] = []
    series = 0
    wanted = _WANTED
    for line in text.splitlines():
        if line.startswith("vllm:"):
            series += 1
            if line.startswith(wanted) and "_created{" not in line and "_created " not in line:
                keep.append(line)
    return keep, series


def prepare(line: str) -> Prepared:
    """tokenize() plus what build_samples decides per sample (kind, key, label)."""
    name, labels, value = tokenize(line)
    if name.endswith("_bucket") and "le" in labels:
        return BUCKET, name[: -len("_bucket")], float(labels["le"]), value, labels
    if name == CACHE_CONFIG_INFO:
        return INFO, name, None, value, labels
    label = LABELLED.get(name)
    key = labels[label] if label and label in labels else None
    if name == RUNNING:
        key = labels.get("engine", "0")
    return VALUE, name, key, value, labels


def build_prepared(prepared: list[Prepared], vllm_series: int) -> MetricSamples:
    """build_samples over prepared samples: the same sums in the same order."""
    sums = Sums()
    values, labelled, raw_buckets = sums.values, sums.labelled, sums.raw_buckets
    info, engines, per_engine = sums.info, sums.engines, sums.per_engine
    for kind, name, key, value, labels in prepared:
        if kind == BUCKET:
            per = raw_buckets.setdefault(name, {})
            per[key] = per.get(key, 0.0) + value  # type: ignore[index,call-overload]
        elif kind == INFO:
            info.update(labels)
        else:
            values[name] = values.get(name, 0.0) + value
            if name in PER_ENGINE:
                d = per_engine.setdefault(labels.get(ENGINE_LABEL, "0"), {})
                d[name] = d.get(name, 0.0) + value
            if key is not None:
                if name == RUNNING:
                    engines.add(key)  # type: ignore[arg-type]
                else:
                    d = labelled.setdefault(name, {})
                    d[key] = d.get(key, 0.0) + value  # type: ignore[index,call-overload]
    return sums.samples(vllm_series)


def build_changed(
    prev: MetricSamples, prepared: list[Prepared], changed: set[str], vllm_series: int
) -> MetricSamples:
    """MetricSamples rebuilt only for the names in ``changed``; the rest reused from ``prev``.

    build_prepared(prepared) when only the samples named in ``changed`` differ from
    those ``prev`` was built from: those names are summed again (their lines in body
    order, so the same sums), every other name's figures are ``prev``'s own objects
    (so a consumer can tell an unchanged histogram by identity)."""
    part = build_prepared([p for p in prepared if p[1] in changed], vllm_series)
    values = {k: v for k, v in prev.values.items() if k not in changed}
    values.update(part.values)
    labelled = {k: v for k, v in prev.labelled.items() if k not in changed}
    labelled.update(part.labelled)
    buckets = {k: v for k, v in prev.buckets.items() if k not in changed}
    buckets.update(part.buckets)
    info = part.info if CACHE_CONFIG_INFO in changed else prev.info
    engines = part.engines if RUNNING in changed else prev.engines
    per_engine = {
        e: {k: v for k, v in d.items() if k not in changed} for e, d in prev.per_engine.items()
    }
    for e, d in part.per_engine.items():
        per_engine.setdefault(e, {}).update(d)
    per_engine = {e: d for e, d in per_engine.items() if d}
    return MetricSamples(values, labelled, buckets, info, engines, vllm_series, per_engine)


def samples_from_lines(lines: list[str], series: int, text: str) -> MetricSamples:
    """MetricSamples of scan()'s lines (the reference parser where the tokenizer fails)."""
    try:
        return build_prepared([prepare(line) for line in lines], series)
    except ValueError:
        return parse_samples(text)  # the reference decides (and raises if unparsable)


def parse_samples_fast(text: str) -> MetricSamples:
    """MetricSamples of a /metrics body: the fast tokenizer, same numbers as parse_samples."""
    lines, series = scan(text)
    return samples_from_lines(lines, series, text)
