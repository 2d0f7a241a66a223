#!/bin/bash
# GPU proof of the console's GPU figures (issue 26 item 1), run on the H200 machine from
# the checkout's root after the bundle is installed into /tmp/site (gpu/README.md):
#
#   bash gpu/console_gpu.sh
#
# 1. gpu_hold.py hold: torch processes holding 1, 2 and 3 GiB; the collector must report
#    each per process and GPU 0's used memory (tolerances in gpu_hold.py) -> $OUT/hold/.
# 2. opsctl serve tiny-llama (vLLM 0.26.0 CUDA, serve's default mode), then
#    `opsctl console --once --json` idle and under load (LOAD_STREAMS concurrent long
#    completions), each with a raw NVML document and nvidia-smi's process list beside it,
#    the engine tree's pids and command lines; serve stopped with SIGINT at the end.
# Outputs: $OUT/console/ (console-idle.json, console-load.json, raw-*.json, ps-*.txt,
# nvidia-smi-*.csv, serve.jsonl, serve.err, summary.log) and $OUT/gpu-console.tar.gz of
# both folders. Only 127.0.0.1 is contacted; everything started here is gone at the end.
set -u
REPO=$(pwd)
export PYTHONPATH=/tmp/site OPSCTL_HOME=/tmp/oh PYTHONUNBUFFERED=1 NO_COLOR=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1 DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/out}
D=$OUT/console
PORT=${PORT:-8000}
URL=http://127.0.0.1:$PORT
LOAD_STREAMS=${LOAD_STREAMS:-32}
T0=$(date +%s)
mkdir -p "$D" /tmp/cg-cwd "$OPSCTL_HOME"
cd /tmp/cg-cwd || exit 1 # the bundle's opsctl, never the checkout's
say() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*" | tee -a "$D/summary.log"; }
opsctl() { python3 -m opsctl "$@"; }

{
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
    python3 -c 'import pynvml, torch; print("pynvml", pynvml.__file__, "torch", torch.__version__)'
    python3 -c 'import vllm; print("vllm", vllm.__version__)'
    grep NSpid /proc/self/status
} >"$D/facts.txt" 2>&1
cat "$D/facts.txt" | tee -a "$D/summary.log"

if [ -z "${SKIP_HOLD:-}" ]; then
    say "gpu_hold.py hold 1,2,3 GiB"
    PYTHONPATH=/tmp/site timeout 240 python3 "$REPO/gpu/gpu_hold.py" hold "$OUT/hold" --gib 1,2,3 2>&1 | tee -a "$D/summary.log"
    say "hold rc=${PIPESTATUS[0]}"
fi

# the engine tree of the API server: pid, ppid, cmdline, NVML's memory per pid beside it
tree() {
    python3 - "$1" <<'PY'
import os, sys
root = int(sys.argv[1])
kids = {}
for x in os.listdir("/proc"):
    if x.isdigit():
        try:
            ppid = int(open(f"/proc/{x}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        kids.setdefault(ppid, []).append(int(x))
todo = [root]
while todo:
    p = todo.pop(0)
    try:
        cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        continue
    print(p, cmd)
    todo += sorted(kids.get(p, []))
PY
}

look() { # look NAME: console --once --json + raw NVML + nvidia-smi + ps
    local name=$1
    python3 "$REPO/gpu/gpu_hold.py" dump "$D/raw-$name-before.json" >/dev/null
    timeout -s INT 60 python3 -m opsctl console --once --json --interval 1s "$URL" >"$D/console-$name.json" 2>"$D/console-$name.err"
    say "console $name rc=$?"
    python3 "$REPO/gpu/gpu_hold.py" dump "$D/raw-$name.json" | tee -a "$D/summary.log"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >"$D/nvidia-smi-$name.csv" 2>&1
    nvidia-smi --query-gpu=utilization.gpu,memory.used,temperature.gpu,power.draw,clocks.sm,clocks.mem --format=csv >>"$D/nvidia-smi-$name.csv" 2>&1
    python3 - "$D/console-$name.json" <<'PY' | tee -a "$D/summary.log"
import json, sys
d = json.load(open(sys.argv[1]))
print("schema", d.get("schema"), "exit", d.get("exit_code"), "host", json.dumps(d.get("host"))[:600])
for e in d["endpoints"]:
    print(e["name"], e["state"], "running", e["requests_running"], "pids", e["pids"])
    for g in e.get("gpus", []):
        print("  GPU", g["index"], g["name"], "util", g["util_pct"], "mem", g["mem_used_bytes"], "/", g["mem_total_bytes"],
              "temp", g["temp_c"], "power", g["power_w"], "/", g["power_limit_w"], "clocks", g["sm_clock_mhz"], g["mem_clock_mhz"])
        for p in g["processes"]:
            print("    ", p)
PY
}

say "models build tiny-llama"
timeout 180 python3 -m opsctl models build tiny-llama --json >"$D/models-build.json" 2>"$D/models-build.err"
say "models build rc=$?"
say "serve tiny-llama"
python3 -m opsctl serve tiny-llama --no-tui --json --port "$PORT" --timeout 300s >"$D/serve.jsonl" 2>"$D/serve.err" &
SP=$!
READY=0
DEADLINE=$(($(date +%s) + 300))
while [ "$(date +%s)" -lt "$DEADLINE" ]; do
    grep -q '"event": *"ready"' "$D/serve.jsonl" 2>/dev/null && { READY=1; break; }
    kill -0 "$SP" 2>/dev/null || break
    sleep 1
done
say "serve ready=$READY"
if [ "$READY" = 1 ]; then
    API=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline()).get("pid") or "")' "$D/serve.jsonl")
    [ -z "$API" ] && API=$(pgrep -f 'vllm.entrypoints.openai.api_server' | head -1)
    tree "$API" >"$D/ps-idle.txt"
    cat "$D/ps-idle.txt" | cut -c1-160 | tee -a "$D/summary.log"
    look idle
    # load: LOAD_STREAMS threads of long completions (ignore_eos) until the stop file
    rm -f /tmp/cg-stop
    python3 - "$URL" "$LOAD_STREAMS" >"$D/load.txt" 2>&1 <<'PY' &
import json, os, sys, threading, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
card = json.load(urllib.request.urlopen(url + "/v1/models", timeout=30))["data"][0]
model, max_tokens = card["id"], max(16, int(card.get("max_model_len") or 512) - 64)
done, errors = [0], []
def worker(i):
    while not os.path.exists("/tmp/cg-stop"):
        body = json.dumps({"model": model, "prompt": f"stream {i} tell me a long story",
                           "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.8}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=300).read()
            done[0] += 1
        except Exception as exc:
            errors.append(str(exc)[:200])
            time.sleep(0.5)
ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
[t.start() for t in ts]
print("started", n, "streams on", model, "max_tokens", max_tokens, flush=True)
while not os.path.exists("/tmp/cg-stop"):
    time.sleep(0.2)
print("completed", done[0], "errors", len(errors), errors[:3], flush=True)
PY
    LP=$!
    # under load once requests run (a condition with a deadline)
    DL=$(($(date +%s) + 60))
    while [ "$(date +%s)" -lt "$DL" ]; do
        R=$(python3 -c 'import sys, urllib.request as u; t = u.urlopen(sys.argv[1] + "/metrics", timeout=5).read().decode(); print(int(sum(float(l.split()[-1]) for l in t.splitlines() if l.startswith("vllm:num_requests_running"))))' "$URL" 2>/dev/null)
        [ "${R:-0}" != 0 ] && break
        sleep 0.5
    done
    say "requests running before the load look: $R"
    sleep "${LOAD_SETTLE_S:-3}" # sustained load: NVML's utilisation is over its last sample period
    look load
    for i in 1 2 3 4 5; do # a few more NVML readings under the same load, 1 s apart
        sleep 1
        python3 "$REPO/gpu/gpu_hold.py" dump "$D/raw-load-$i.json" | tee -a "$D/summary.log"
    done
    tree "$API" >"$D/ps-load.txt"
    touch /tmp/cg-stop
    sleep 2
    kill "$LP" 2>/dev/null
    wait "$LP" 2>/dev/null
    cat "$D/load.txt" | tee -a "$D/summary.log"
else
    tail -n 40 "$D/serve.err" | tee -a "$D/summary.log"
fi
say "stop serve (SIGINT)"
kill -INT "$SP" 2>/dev/null
for _ in $(seq 1 60); do kill -0 "$SP" 2>/dev/null || break; sleep 1; done
kill -9 "$SP" 2>/dev/null
wait "$SP" 2>/dev/null
say "left: $(ps -eo pid,cmd | grep -E 'vllm|EngineCore|gpu_hold' | grep -v grep | head -5 | tr '\n' ';')"
RD=$(ls -d "$OPSCTL_HOME"/runs/*/ 2>/dev/null | tail -1)
[ -n "$RD" ] && tail -c 300000 "$RD/server.log" >"$D/server.log"
say "done"
tar -czf "$OUT/gpu-console.tar.gz" -C "$OUT" console $( [ -d "$OUT/hold" ] && echo hold)
ls -la "$OUT"
