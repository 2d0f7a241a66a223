"""GPU check for `opsctl engram inspect` (issue 4, criterion 6). Needs a CUDA GPU and
torch; not run by CI or `make bench` on CPU machines (exits 0 with a note there).

Builds an Engram table the way vLLM's DPSharedEngramStorage does: a file
/dev/shm/vllm_engram_gpucheck_*, ftruncate, mmap MAP_SHARED, constant fill (weights 0x38,
ue8m0 scales 127); two child processes map it, touch it and pin it with
torch.cuda.cudart().cudaHostRegister, as every DP rank does; this process pins it too and
reads it from the GPU (DMA copy of the pinned pages, and a zero-copy UVA scan of the
registered host pointer through CuPy when available). Then opsctl's own collector +
domain run on it while pinned, before and after the unlink, and once more with a
corrupted byte, and the reports are compared.

    PYTHONPATH=. python3 benchmarks/gpu_engram_pin.py [--gib 1]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import time

import numpy as np

CHILD = r"""
import mmap, os, sys
import numpy as np, torch
fd = os.open(sys.argv[1], os.O_RDWR); size = os.fstat(fd).st_size
mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED); os.close(fd)
a = np.frombuffer(mm, dtype=np.uint8); int(a[::4096].sum())
def smaps():
    out = {}
    with open("/proc/self/smaps") as fh:
        lines = fh.read().splitlines()
    for i, l in enumerate(lines):
        if sys.argv[1] in l:
            for k in lines[i + 1:i + 30]:
                key = k.split(":")[0]
                if key in ("Rss", "Pss", "Locked", "VmFlags"):
                    out[key] = k.split(":", 1)[1].strip()
                if key == "VmFlags":
                    break
            return out
before = smaps()
res = torch.cuda.cudart().cudaHostRegister(a.ctypes.data, size, 0)
pinned = torch.from_numpy(a).is_pinned()
print("ready", os.getpid(), int(getattr(res, "value", res)), pinned, "before", before, "after", smaps(), flush=True)
sys.stdin.readline()
torch.cuda.cudart().cudaHostUnregister(a.ctypes.data)
"""


def summary(snap, name):
    from opsctl.suite.engram import collect as col
    from opsctl.suite.engram import judge as dom

    doc = col.snapshot_to_dict(snap)
    tabs = [t for t in doc["tables"] if t["name"] == name]
    if not tabs:
        return {"found": False, "scan_errors": doc["scan_errors"]}
    t = tabs[0]
    return {
        "found": True,
        "linked": t["linked"],
        "size": t["size"],
        "size_source": t["size_source"],
        "layout": t["layout"],
        "mappers": [
            {k: m[k] for k in ("pid", "deleted", "rss", "pss", "locked", "vmflags")}
            for m in t["mappers"]
        ],
        "verify": {
            k: t["verify"][k]
            for k in ("status", "mode", "access", "bytes_checked", "first_mismatch", "gbps")
        },
        "findings": [f.message for f in dom.table_findings(t)],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="weight bytes of the table, GiB")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch not installed: GPU check skipped")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA GPU: GPU check skipped")
        return 0
    from opsctl.suite.engram import collect as col

    dim = 256
    rows = int(args.gib * 2**30) // dim
    weight = rows * dim
    total = weight + weight // 128
    prefix = f"vllm_engram_gpucheck_{os.getpid()}_"
    path = f"/dev/shm/{prefix}a"
    result: dict = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "total_bytes": total,
    }
    children: list[subprocess.Popen] = []
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    registered = False
    try:
        os.ftruncate(fd, total)
        mm = mmap.mmap(fd, total, flags=mmap.MAP_SHARED)
        os.close(fd)
        arr = np.frombuffer(mm, dtype=np.uint8)
        t0 = time.perf_counter()
        arr[:weight] = 0x38
        arr[weight:] = 127
        result["fill_s"] = round(time.perf_counter() - t0, 3)
        for _ in range(2):
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", CHILD, path],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        result["children"] = [c.stdout.readline().strip() for c in children]
        t0 = time.perf_counter()
        res = torch.cuda.cudart().cudaHostRegister(arr.ctypes.data, total, 0)
        registered = int(getattr(res, "value", res)) == 0
        host = torch.from_numpy(arr)
        result["register"] = {
            "ok": registered,
            "s": round(time.perf_counter() - t0, 3),
            "is_pinned": host.is_pinned(),
        }

        def gpu_check() -> dict:
            out: dict = {}
            torch.cuda.synchronize()
            t = time.perf_counter()
            dev = host.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            bad_w = int((dev[:weight] != 0x38).sum())
            bad_s = int((dev[weight:] != 127).sum())
            first = None
            if bad_w or bad_s:
                w = torch.nonzero(dev[:weight] != 0x38)
                s = torch.nonzero(dev[weight:] != 127)
                first = int(w[0]) if len(w) else weight + int(s[0])
            out["dma"] = {
                "GBps": round(total / dt / 1e9, 1),
                "bad_weights": bad_w,
                "bad_scales": bad_s,
                "first_bad": first,
            }
            del dev
            try:
                import cupy as cp

                try:  # the device address of the registered pages (UVA: usually the host address)
                    dptr = int(cp.cuda.runtime.pointerGetAttributes(arr.ctypes.data).devicePointer)
                except Exception:
                    dptr = arr.ctypes.data
                mem = cp.cuda.UnownedMemory(dptr, total, owner=None)
                view = cp.ndarray((total,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))
                cp.cuda.runtime.deviceSynchronize()
                t = time.perf_counter()
                bad = int(cp.count_nonzero(view[:weight] != 0x38)) + int(
                    cp.count_nonzero(view[weight:] != 127)
                )
                cp.cuda.runtime.deviceSynchronize()
                dt = time.perf_counter() - t
                out["uva_zero_copy"] = {
                    "device_ptr_equals_host_ptr": dptr == arr.ctypes.data,
                    "bad": bad,
                    "GBps": round(total / dt / 1e9, 1),
                }
            except Exception as exc:
                out["uva_zero_copy"] = {"error": repr(exc)}
            return out

        result["gpu_read"] = gpu_check()
        name = os.path.basename(path)
        result["inspect_linked"] = summary(col.inspect(verify="full", prefix=prefix), name)
        os.unlink(path)  # the leader unlinks once every rank has mapped and pinned it
        result["inspect_deleted"] = summary(col.inspect(verify="full", prefix=prefix), name)
        result["inspect_deleted_mem"] = summary(
            col.inspect(verify="full", prefix=prefix, access=("mem",)), name
        )
        arr[12345] = 0x00  # corrupt one weight byte through the pinned mapping
        result["gpu_read_corrupted"] = gpu_check()
        result["inspect_corrupted"] = summary(col.inspect(verify="full", prefix=prefix), name)
        arr[12345] = 0x38
        a, b = result["inspect_linked"], result["inspect_deleted"]
        result["identical_except_linked"] = (
            a["size"] == b["size"]
            and a["layout"] == b["layout"]
            and [m["pid"] for m in a["mappers"]] == [m["pid"] for m in b["mappers"]]
            and a["verify"]["status"] == b["verify"]["status"] == "constant"
        )
    finally:
        if registered:
            torch.cuda.cudart().cudaHostUnregister(arr.ctypes.data)
        for c in children:
            try:
                c.stdin.write("\n")
                c.stdin.flush()
                c.wait(20)
            except Exception:
                c.kill()
        if os.path.exists(path):
            os.unlink(path)
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_engram.json"), "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
