"""GPU proof of opsctl's GPU collector (issue 26 item 1), run on the H200 machine.

``python3 gpu/gpu_hold.py hold OUTDIR [--gib 1,2,3]``: starts one torch process per
amount, each holding that many GiB of CUDA memory (``torch.empty`` on ``cuda:0``, every
page written), reads the GPUs through ``opsctl.collectors.gpu.GpuCollector`` before,
while they hold, and after they exit, and asserts:

- each holder's pid is listed on GPU 0 with ``used_bytes`` = its amount plus a CUDA
  context overhead in [0, OVERHEAD_MAX] (1 GiB), and the overheads of the holders agree
  within SPREAD_MAX (64 MiB): the per-process figure follows what the process holds;
- GPU 0's ``mem_used_bytes`` grew, from before to while holding, by the sum of the
  holders' per-process figures within GROWTH_TOL (256 MiB), and fell back within that
  after they exited;
- the holders map to their roles through ``opsctl.domain.gpu.endpoint_gpus``;
- a collection is cheap (mean and max ms over 20 calls, NVML handles cached).

Writes OUTDIR/raw-before.json, raw-held.json, raw-after.json (the collector's raw NVML
documents: the CI replays them), OUTDIR/hold.json (amounts, pids, figures, checks,
verdict); exit 0 when every check passed, 1 otherwise.

``python3 gpu/gpu_hold.py dump FILE``: one raw collection into FILE (console_gpu.sh
records NVML beside each console document with it).

``python3 gpu/gpu_hold.py child GIB``: a holder (started by ``hold``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import NamedTuple

GIB = 2**30
OVERHEAD_MAX = GIB  # CUDA context + torch's allocator rounding, per process
SPREAD_MAX = 64 * 2**20
GROWTH_TOL = 256 * 2**20
READY_TIMEOUT_S = 120.0


def child(gib: float) -> int:
    import torch

    n = int(gib * GIB)
    buf = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    buf.fill_(1)  # every page really backed
    torch.cuda.synchronize()
    print(json.dumps({"ready": True, "pid": os.getpid(), "bytes": n,
                      "torch_reserved": torch.cuda.memory_reserved(0)}), flush=True)  # fmt: skip
    sys.stdin.read()  # hold until the parent closes our stdin
    del buf
    return 0


def dump(path: str) -> int:
    from opsctl.collectors.gpu import GpuCollector

    raw = GpuCollector().raw()
    with open(path, "w") as fh:
        json.dump(raw, fh, indent=1)
    print(f"{path}: source={raw.get('source')} devices={len(raw.get('devices') or [])} "
          f"error={raw.get('error')}")  # fmt: skip
    return 0


class Role(NamedTuple):
    pid: int
    role: str


def _gpu0(raw: dict) -> dict:
    return (raw.get("devices") or [{}])[0]


def hold(outdir: str, amounts: list[float]) -> int:
    from opsctl.collectors.gpu import GpuCollector
    from opsctl.domain.gpu import endpoint_gpus, host_from_raw

    os.makedirs(outdir, exist_ok=True)
    col = GpuCollector()
    checks: list[dict] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    def save(name: str, raw: dict) -> dict:
        with open(os.path.join(outdir, f"raw-{name}.json"), "w") as fh:
            json.dump(raw, fh, indent=1)
        return raw

    before = save("before", col.raw())
    if before.get("source") != "nvml":
        check("nvml", False, f"no NVML reading: {before.get('error')}")
        return _finish(outdir, amounts, [], checks, {})
    kids = []
    for gib in amounts:
        p = subprocess.Popen([sys.executable, __file__, "child", str(gib)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
        kids.append((gib, p))
    info = {}
    deadline = time.monotonic() + READY_TIMEOUT_S
    for _gib, p in kids:  # each prints one line when it holds (or dies)
        line = p.stdout.readline() if time.monotonic() < deadline else ""
        info[p.pid] = json.loads(line) if line.strip() else {"ready": False}
    ready = all(i.get("ready") for i in info.values())
    check("holders_ready", ready, f"{sum(bool(i.get('ready')) for i in info.values())}/{len(kids)}")
    time.sleep(1.0)  # NVML's process list is refreshed by the driver, not on demand
    held = save("held", col.raw())
    timings = []
    for _ in range(20):
        t0 = time.perf_counter()
        col.raw()
        timings.append((time.perf_counter() - t0) * 1000)
    for _gib, p in kids:
        p.stdin.close()
    for _gib, p in kids:
        p.wait(timeout=60)
    after_deadline = time.monotonic() + 30
    after = col.raw()
    pids = {p.pid for _g, p in kids}
    while time.monotonic() < after_deadline and any(
        x["pid"] in pids for x in _gpu0(after).get("procs", [])
    ):
        time.sleep(0.2)
        after = col.raw()
    save("after", after)

    host = host_from_raw(held)
    dev0 = host.devices[0]
    per_pid = {p.pid: p.used_bytes for p in dev0.processes}
    rows, overheads = [], []
    for gib, p in kids:
        want = int(gib * GIB)
        got = per_pid.get(p.pid)
        over = None if got is None else got - want
        rows.append({"pid": p.pid, "held_bytes": want, "nvml_used_bytes": got,
                     "overhead_bytes": over, "torch_reserved_bytes": info[p.pid].get("torch_reserved")})  # fmt: skip
        ok = over is not None and 0 <= over <= OVERHEAD_MAX
        check(f"per_process_{gib:g}GiB", ok,
              f"pid {p.pid} holds {want} B, NVML says {got} B (overhead {over} B, allowed 0..{OVERHEAD_MAX})")  # fmt: skip
        if over is not None:
            overheads.append(over)
    if overheads:
        spread = max(overheads) - min(overheads)
        check(
            "overhead_agrees",
            spread <= SPREAD_MAX,
            f"overheads spread {spread} B (allowed {SPREAD_MAX})",
        )
    used_before, used_held = _gpu0(before).get("mem_used"), _gpu0(held).get("mem_used")
    used_after = _gpu0(after).get("mem_used")
    sum_procs = sum(r["nvml_used_bytes"] or 0 for r in rows)
    growth = None if None in (used_before, used_held) else used_held - used_before
    check("per_gpu_growth", growth is not None and abs(growth - sum_procs) <= GROWTH_TOL,
          f"GPU0 used {used_before} -> {used_held} B (+{growth}), holders' sum {sum_procs} B, tolerance {GROWTH_TOL}")  # fmt: skip
    back = None if None in (used_before, used_after) else used_after - used_before
    check("per_gpu_released", back is not None and abs(back) <= GROWTH_TOL,
          f"after exit GPU0 used {used_after} B ({back:+} B from before)" if back is not None else "unknown")  # fmt: skip
    roles = [Role(p.pid, f"holder-{g:g}GiB") for g, p in kids]  # as the console's ProcRole
    mapped = endpoint_gpus(host, roles)
    got_roles = sorted(p.role for d in mapped for p in d.processes)
    check("roles_mapped", got_roles == sorted(r.role for r in roles), f"{got_roles}")
    cost = {
        "collect_mean_ms": round(sum(timings) / len(timings), 3),
        "collect_max_ms": round(max(timings), 3),
    }
    check("collect_cheap", cost["collect_mean_ms"] < 50, f"{cost}")
    return _finish(outdir, amounts, rows, checks, {**cost, "gpu0": {"before": used_before, "held": used_held,
                   "after": used_after, "total": dev0.mem_total_bytes, "name": dev0.name}})  # fmt: skip


def _finish(outdir: str, amounts: list[float], rows: list, checks: list, extra: dict) -> int:
    ok = bool(checks) and all(c["ok"] for c in checks)
    doc = {"schema": "opsctl.gpu-hold/1", "amounts_gib": amounts, "holders": rows,
           "tolerances": {"overhead_max_bytes": OVERHEAD_MAX, "spread_max_bytes": SPREAD_MAX,
                          "growth_tol_bytes": GROWTH_TOL},
           "checks": checks, "verdict": "pass" if ok else "fail", **extra}  # fmt: skip
    with open(os.path.join(outdir, "hold.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"verdict: {doc['verdict']}")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "child":
        return child(float(argv[1]))
    if len(argv) == 2 and argv[0] == "dump":
        return dump(argv[1])
    if argv and argv[0] == "hold" and len(argv) in (2, 4):
        amounts = [1.0, 2.0, 3.0]
        if len(argv) == 4 and argv[2] == "--gib":
            amounts = [float(x) for x in argv[3].split(",")]
        return hold(argv[1], amounts)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
