#!/bin/bash
# GPU proof of opsctl on a real CUDA vLLM (issue 25, item 1): `bash gpu/prove.sh STAGE`.
#
# Runs on the H200 machine after the bundle of ../shared/tools/gpu/ is staged and installed
# into /tmp/site (gpu/README.md has the device commands). One STAGE per device command;
# each stays under its budget (PROVE_BUDGET, default 530 s: a device command may run 600 s)
# and every opsctl call runs under `timeout -s INT` with the smaller of its own budget and
# what is left of the stage's (a call that no longer fits is recorded as skipped). Stages
# are independent (each builds the tiny models it needs) and can run back to back on one
# warm machine. Expected on the H200 (engine starts 75-110 s eager, more with CUDA graphs):
#
#   serve    ~300 s  facts; models build; `opsctl serve tiny-llama` in vLLM's default
#                    execution mode (no --eager); status, console --once --json (process
#                    roles) and plain, patches, diag invariance URL against it; SIGKILL of
#                    opsctl serve and the seconds until its engine tree is gone (15 s
#                    allowed); then diag invariance --model tiny-llama --mode eager
#   checks   ~450 s  diag usage --model tiny-reranker; diag mm-uuid --model tiny-vlm-multi
#                    (caches-off and caches-on engines); diag kv-fail --model tiny-hybrid
#   lora     ~400 s  diag lora tiny-llama; diag lora tiny-vlm-multi; diag invariance
#                    --model tiny-vlm-multi (images, default mode)
#   certify  ~450 s  certify --model tiny-llama (--junit, --sarif; invariance in default
#                    mode, kv-fail tiny-llama, ...); diag invariance --model tiny-llama
#                    --mode default when time is left
#   facts    ~20 s   only the facts (also the first step of serve)
#   recovery ~450 s  issue 34: diag kv-fail --mode default (vLLM's default mode: async
#                    scheduling, V2 runner, CUDA graphs, bf16) on tiny-llama: recompute,
#                    --no-patch, --policy fail (tiny-hybrid too, if time is left)
#   recovery2 ~500 s tiny-hybrid recompute, --no-patch and --policy fail; float32 both
#                    ways (gpu/repro_kv_fail.py v2-eager-fp32 with and without the
#                    patches: fp32.json); certify --model tiny-llama
#   images   ~450 s  diag mm-uuid, invariance (images) and lora on tiny-vlm-multi; diag
#                    lora on tiny-vlm (BLIP-2)
#   images2  ~550 s  diag mm-uuid on tiny-vlm-multi (caches off and on: two engines, 300 s)
#                    and diag lora --model tiny-vlm-multi (250 s): the calls `images` ran
#                    out of time for
#   uuid     ~350 s  diag mm-uuid on tiny-vlm-multi and on tiny-vlm (BLIP-2), caches off and
#                    on, with the mm_uuid_keep patch (PR 56432's fix, which 0.26 lacks)
#   hang     ~500 s  issue 35 item 5: gpu/hang_gpu.py (one tiny-llama engine in the
#                    default mode, a GPU-side hang (spinning kernel) and a host-side one:
#                    console --once's state and GPU signature, stacks, py-spy --native;
#                    hang.json, hang-run/), then diag lora --model tiny-vlm (BLIP-2)
#   prefill  ~350 s  issue 35 item 3 on CUDA: gpu/prefill_gpu.py (a dummy Llama-3-8B-shaped
#                    engine in the default mode, 32 tokens a step, a ~45 s prefill:
#                    /metrics every 0.5 s, console --once and status while it runs;
#                    prefill.json, prefill-run/)
#   fidelity ~450 s  issue 45 item 3: diag kv-fail --mode default --seeds 0-9 on tiny-llama
#                    and tiny-hybrid, patched and --no-patch, and the hybrid seeds 1,3,5
#                    alone: 9 calls side by side (gpu/fidelity_gpu.py plan; hybrid
#                    --no-patch kills its engine every seed, so its seeds go in pairs), each
#                    engine with --gpu-memory-utilization 0.08 --kv-cache-memory-bytes 1G;
#                    fidelity.json = the confusion matrix (gpu/fidelity_gpu.py matrix).
#                    FIDELITY_SEEDS (0-9), FIDELITY_MODE (default), FIDELITY_STAGGER (3 s)
#
# The opsctl that runs is the checkout's (PYTHONPATH=<checkout>:/tmp/site, so a change
# needs no new bundle); PROVE_CODE=bundle runs the bundle's wheel instead. facts.txt
# names the files imported and PROVE_COMMIT (give it on the command line).
#
# Outputs: /tmp/prove/STAGE/ (per call: NAME.json or NAME.txt = stdout, NAME.err =
# stderr; serve.jsonl = opsctl serve's events, sigkill.json = the SIGKILL measurement;
# calls.jsonl = argv, rc, seconds, limit per call; runs/NAME/<run dir>/ = the run
# directories the call created: meta.json, ledger/*.json, events/*.jsonl, the last 2 MB of
# server.log; engine_facts.txt = per engine its execution mode, attention backend, KV
# cache, async scheduling, from server.log; facts.txt; summary.log), then ONE $OUT/STAGE.tar.gz
# of that folder and $OUT/STAGE.log (the summary, also on stdout). Every engine this
# script started is gone at the end of a stage (killed if need be, and said so).
#
# Only 127.0.0.1 is ever contacted. OPSCTL_PROVE_LOCAL=1 runs it on a machine without a
# GPU for a dry run of the flags (python3 from PATH, e.g. PATH=.venv/bin:$PATH;
# OPSCTL_HOME=/tmp/provehome, a free port instead of 8000, OUT=/tmp/proveout).
set -u
STAGE=${1:-}
case "$STAGE" in facts | serve | checks | lora | certify | recovery | recovery2 | images | images2 | hang | uuid | prefill | fidelity) ;; *)
    echo "usage: bash gpu/prove.sh facts|serve|checks|lora|certify|recovery|recovery2|images|images2|hang|uuid|prefill|fidelity" >&2
    exit 2
    ;;
esac
T_START=$(date +%s)
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUDGET=${PROVE_BUDGET:-530}
DEADLINE=$((T_START + BUDGET))

if [ -n "${OPSCTL_PROVE_LOCAL:-}" ]; then
    export OPSCTL_HOME=${OPSCTL_HOME:-/tmp/provehome}
    export OUT=${OUT:-/tmp/proveout}
    WORK=${PROVE_WORK:-/tmp/prove-local}
    PORT=${PROVE_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
else # the environment of ../shared/tools/gpu/bin/env.sh
    if [ "${PROVE_CODE:-checkout}" = bundle ]; then export PYTHONPATH=/tmp/site; else export PYTHONPATH=$REPO:/tmp/site; fi
    export OPSCTL_HOME=/tmp/oh
    export OUT=${OUT:-/tmp/out}
    WORK=${PROVE_WORK:-/tmp/prove}
    PORT=${PROVE_PORT:-8000}
fi
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1
export DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NO_COLOR=1
URL=http://127.0.0.1:$PORT
D=$WORK/$STAGE
RUN_CWD=$WORK/cwd # opsctl runs from here: the bundle's opsctl, never the checkout's
rm -rf "$D"
mkdir -p "$D" "$RUN_CWD" "$OUT" "$OPSCTL_HOME"
cd "$RUN_CWD" || exit 1 # python3 here imports nothing from the checkout
SUMMARY=$D/summary.log

ts() { date -u +%H:%M:%S; }
left() { echo $((DEADLINE - $(date +%s))); }
say() { echo "[$(ts) +$(($(date +%s) - T_START))s] $*" | tee -a "$SUMMARY"; }

# pid and command of every live process that carries this script's OPSCTL_HOME in its
# environment (opsctl and the engines it started), bar this shell and its helpers: on a
# shared machine another user's vLLM is never listed, let alone killed
ours() {
    python3 - "$OPSCTL_HOME" "$$" <<'PY'
import os, re, sys
want, me = ("OPSCTL_HOME=" + sys.argv[1]).encode(), {os.getpid(), os.getppid(), int(sys.argv[2])}
for p in sorted((int(x) for x in os.listdir("/proc") if x.isdigit())):
    if p in me:
        continue
    try:
        env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
        state = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        continue
    if want in env and state != "Z" and re.search("python|vllm|VLLM|EngineCore", cmd) and not cmd.startswith("python3 - "):
        print(p, cmd[:160])
PY
}

# every vLLM-looking process on the machine (information only; the device runs nothing else)
vllm_ps() { ps -eo pid,cmd | grep -E 'vllm|EngineCore' | grep -v -E 'grep|prove.sh' | cut -c1-160 | head -20; }

cleanup() { # kill whatever of ours is left, say so
    local procs
    procs=$(ours)
    if [ -n "$procs" ]; then
        say "LEFTOVER processes at the end of $1, killed: $(echo "$procs" | tr '\n' ';')"
        kill -9 $(echo "$procs" | cut -d' ' -f1) 2>/dev/null
    else
        say "no leftover process at the end of $1"
    fi
}

runs_now() { ls "$OPSCTL_HOME/runs" 2>/dev/null | sort; }

# copy the engine facts of the run directories not listed in $1 (runs_now before a call)
# into $2
collect_runs() {
    local before=$1 dest=$2 rd
    for rd in $(runs_now | comm -13 "$before" -); do
        rd=$OPSCTL_HOME/runs/$rd
        local to=$dest/$(basename "$rd")
        mkdir -p "$to"
        cp "$rd"/*.json "$to"/ 2>/dev/null
        [ -d "$rd/ledger" ] && cp -r "$rd/ledger" "$to"/
        [ -d "$rd/events" ] && cp -r "$rd/events" "$to"/
        [ -f "$rd/server.log" ] && tail -c 2000000 "$rd/server.log" >"$to/server.log"
    done
}

# engine facts of the run directories under $1 (from their server.log): execution mode,
# attention backend, KV cache, async scheduling; one line each, also into engine_facts.txt
engine_facts() {
    local rd
    for rd in "$1"/*/; do
        [ -f "$rd/server.log" ] || continue
        python3 - "$rd/server.log" <<'PY' | sed "s|^|    $(basename "$rd"): |" | tee -a "$D/engine_facts.txt" "$SUMMARY"
import re, sys
log = open(sys.argv[1], errors="replace").read()
pats = {"enforce_eager": r"enforce_eager=(\w+)", "compilation": r"'mode': <CompilationMode\.(\w+)",
        "cudagraph_mode": r"'cudagraph_mode': <CUDAGraphMode\.(\w+)", "attention": r"Using (\w+) (?:attention )?backend",
        "kv_cache_tokens": r"KV cache size: ([\d,]+) tokens", "async_scheduling": r"Asynchronous scheduling is (\w+)",
        "v2_model_runner": r"(V2 Model Runner)", "dtype": r"dtype=(torch\.\w+)"}
facts = {k: (m.group(1) if (m := re.search(p, log)) else None) for k, p in pats.items()}
errors = len(re.findall(r"Traceback|ERROR", log))
print(" ".join(f"{k}={v}" for k, v in facts.items()), f"error_lines={errors}")
PY
    done
}

# one line about a JSON result: schema, verdict/state/exit code
brief() {
    python3 - "$1" <<'PY' 2>/dev/null || echo "(not JSON: $(head -c 200 "$1" | tr '\n' ' '))"
import json, sys
d = json.load(open(sys.argv[1]))
keys = ("schema", "verdict", "state", "exit_code", "reason", "platform", "vllm_version")
print(" ".join(f"{k}={d[k]}" for k in keys if k in d and d[k] is not None)[:300])
PY
}

record() { # record NAME RC SECONDS LIMIT ARGV...
    local name=$1 rc=$2 sec=$3 lim=$4
    shift 4
    python3 - "$D/calls.jsonl" "$name" "$rc" "$sec" "$lim" "$@" <<'PY'
import json, sys
path, name, rc, sec, lim, *argv = sys.argv[1:]
row = {"name": name, "argv": ["opsctl", *argv], "rc": None if rc == "skipped" else int(rc),
       "skipped": rc == "skipped", "seconds": float(sec), "limit_s": int(lim)}
open(path, "a").write(json.dumps(row) + "\n")
PY
}

# call NAME WANT_S MIN_S ARGS...: python3 -m opsctl ARGS under timeout -s INT (the smaller
# of WANT_S and the stage's time left less 25 s; skipped below MIN_S). "@T" in ARGS becomes
# that limit less 30 s as a duration (for --timeout). stdout -> NAME.json (with --json) or
# NAME.txt, stderr -> NAME.err; run directories it created -> runs/NAME/.
call() {
    local name=$1 want=$2 min=$3
    shift 3
    local lim=$(($(left) - 25))
    [ "$lim" -gt "$want" ] && lim=$want
    if [ "$lim" -lt "$min" ]; then
        say "$name SKIPPED: $(left) s left in the stage, it needs $min s"
        record "$name" skipped 0 "$lim" "$@"
        return 0
    fi
    local t=$((lim - 30)) args=() a
    [ "$t" -lt 20 ] && t=20
    for a in "$@"; do [ "$a" = "@T" ] && args+=("${t}s") || args+=("$a"); done
    local ext=txt
    case " $* " in *" --json "*) ext=json ;; esac
    local mark=$D/.runs-$name t0 rc sec
    runs_now >"$mark"
    say "$name: opsctl ${args[*]} (limit ${lim}s)"
    t0=$(date +%s.%N)
    (cd "$RUN_CWD" && exec timeout -k 20 -s INT "$lim" python3 -m opsctl "${args[@]}") >"$D/$name.$ext" 2>"$D/$name.err"
    rc=$?
    sec=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
    record "$name" "$rc" "$sec" "$lim" "${args[@]}"
    if [ -z "${NO_COLLECT:-}" ]; then # calls side by side collect their run dirs afterwards
        collect_runs "$mark" "$D/runs/$name"
        [ -d "$D/runs/$name" ] && engine_facts "$D/runs/$name"
    fi
    local what=""
    [ "$ext" = json ] && what=$(brief "$D/$name.$ext")
    say "$name rc=$rc ${sec}s $what"
    [ "$rc" -ne 0 ] && tail -n 5 "$D/$name.err" | sed 's/^/    stderr: /' | tee -a "$SUMMARY"
    return 0
}

facts() {
    local f=$D/facts.txt
    {
        echo "date_utc $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi -L
            nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
        else
            echo "no nvidia-smi (local dry run)"
        fi
        python3 --version
        python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'
        python3 -c 'import vllm; print("vllm", vllm.__version__)'
        python3 -c 'import opsctl, engine_patches; print("opsctl", opsctl.__file__, "engine_patches", engine_patches.__file__)'
        echo "opsctl commit ${PROVE_COMMIT:-unknown}"
        echo "opsctl serve --eager exists: $( (cd "$RUN_CWD" && python3 -m opsctl serve --help) | grep -c -- --eager)"
        nproc
        free -g | head -2
    } >"$f" 2>&1
    cat "$f" | tee -a "$SUMMARY"
    call version 60 20 version --json
}

build() { call models-build 180 30 models build "$@" --json; }

# serve tiny-llama (vLLM's default execution mode), the commands against it, SIGKILL
serve_block() {
    local mark=$D/.runs-serve sp ready=0 t0
    runs_now >"$mark"
    say "serve: opsctl serve tiny-llama --no-tui --json --port $PORT --timeout 300s (default execution mode)"
    t0=$(date +%s.%N)
    (cd "$RUN_CWD" && exec python3 -m opsctl serve tiny-llama --no-tui --json --port "$PORT" --timeout 300s) >"$D/serve.jsonl" 2>"$D/serve.err" &
    sp=$!
    while [ "$(left)" -gt 200 ]; do # a condition with a deadline: ready, or serve gone
        grep -q '"event": *"ready"' "$D/serve.jsonl" 2>/dev/null && { ready=1; break; }
        kill -0 "$sp" 2>/dev/null || break
        sleep 1
    done
    local sec
    sec=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
    record serve-ready "$((1 - ready))" "$sec" 300 serve tiny-llama --no-tui --json --port "$PORT" --timeout 300s
    say "serve ready=$ready after ${sec}s: $(head -c 600 "$D/serve.jsonl")"
    if [ "$ready" = 1 ]; then
        local run_dir
        run_dir=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["run_dir"])' "$D/serve.jsonl")
        call status 40 10 status "$URL" --json
        call console-json 60 20 console --once --json "$URL"
        call console-plain 60 20 console --once "$URL"
        call patches 40 10 patches --run "$run_dir" --json
        call invariance-served 200 60 diag invariance "$URL" --json --no-tui --timeout 120s
        call status-after 40 10 status "$URL" --json
    else
        tail -n 30 "$D/serve.err" | sed 's/^/    serve stderr: /' | tee -a "$SUMMARY"
    fi
    sigkill_serve "$sp"
    collect_runs "$mark" "$D/runs/serve"
    engine_facts "$D/runs/serve"
}

# SIGKILL opsctl serve (no stopped event can follow in serve.jsonl); the seconds until every process of its tree is gone (15 s allowed,
# watched for 30 s) -> sigkill.json
sigkill_serve() {
    local sp=$1
    python3 - "$sp" "$D/sigkill.json" "$OPSCTL_HOME" <<'PY' | tee -a "$SUMMARY"
import json, os, signal, sys, time
sp, out, home = int(sys.argv[1]), sys.argv[2], sys.argv[3]

def stat(p):
    try:
        s = open(f"/proc/{p}/stat").read()
        return s.rsplit(")", 1)[1].split()
    except OSError:
        return None

def alive(p):
    s = stat(p)
    return s is not None and s[0] != "Z"

def cmd(p):
    try:
        return open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return ""

def tree(root):
    kids = {}
    for x in os.listdir("/proc"):
        if x.isdigit() and (s := stat(int(x))):
            kids.setdefault(int(s[1]), []).append(int(x))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out

before = [p for p in tree(sp) if alive(p)]
doc = {"opsctl_pid": sp, "opsctl_alive_before": alive(sp),
       "tree_before": [{"pid": p, "cmd": cmd(p)} for p in before], "allowed_s": 15.0}
t0 = time.monotonic()
try:
    os.kill(sp, signal.SIGKILL)
except ProcessLookupError:
    pass
gone_after = None
while time.monotonic() - t0 < 30:
    try:
        os.waitpid(sp, os.WNOHANG)  # sp is a child of the calling shell, not of this script
    except ChildProcessError:
        pass
    if not [p for p in before if p != sp and alive(p)]:
        gone_after = round(time.monotonic() - t0, 2)
        break
    time.sleep(0.1)
doc["gone_after_s"] = gone_after
doc["left_after_30s"] = [{"pid": p, "cmd": cmd(p)} for p in before if p != sp and alive(p)]
doc["verdict"] = "pass" if gone_after is not None and gone_after <= 15 else "fail"
json.dump(doc, open(out, "w"), indent=1)
print(f"sigkill: opsctl serve pid {sp}, {len(before)} processes in its tree, "
      f"engine tree gone after {gone_after} s (15 s allowed): {doc['verdict']}; "
      f"left: {doc['left_after_30s']}")
PY
    wait "$sp" 2>/dev/null
    say "vLLM processes now: $(vllm_ps | tr '\n' ';')"
}

say "stage $STAGE: budget ${BUDGET}s, OPSCTL_HOME=$OPSCTL_HOME, out $D, url $URL"
cleanup "the previous stage"
case "$STAGE" in
facts)
    facts
    ;;
serve)
    facts
    build tiny-llama tiny-hybrid tiny-reranker tiny-vlm-multi
    serve_block
    call invariance-eager 220 130 diag invariance --model tiny-llama --mode eager --json --no-tui --timeout @T
    ;;
checks)
    build tiny-hybrid tiny-reranker tiny-vlm-multi
    call usage-reranker 200 100 diag usage --model tiny-reranker --json --no-tui
    call mm-uuid-vlm 300 150 diag mm-uuid --model tiny-vlm-multi --json --no-tui
    call kv-fail-hybrid 200 100 diag kv-fail --model tiny-hybrid --json --no-tui --timeout @T
    ;;
lora)
    build tiny-llama tiny-vlm-multi
    call lora-llama 200 100 diag lora --model tiny-llama --json --no-tui --timeout @T
    call lora-vlm 220 110 diag lora --model tiny-vlm-multi --json --no-tui --timeout @T
    call invariance-vlm 220 120 diag invariance --model tiny-vlm-multi --mode default --json --no-tui --timeout @T
    ;;
recovery)
    facts
    build tiny-llama tiny-hybrid
    kvf="diag kv-fail --mode default --json --no-tui --timeout @T"
    call kvfail-llama 200 100 $kvf --model tiny-llama
    call kvfail-llama-nopatch 170 90 $kvf --model tiny-llama --no-patch
    call kvfail-llama-fail 170 90 $kvf --model tiny-llama --policy fail
    call kvfail-hybrid 200 100 $kvf --model tiny-hybrid
    ;;
recovery2)
    facts
    build tiny-llama tiny-hybrid
    kvf="diag kv-fail --mode default --json --no-tui --timeout @T"
    call kvfail-hybrid 170 90 $kvf --model tiny-hybrid
    call kvfail-hybrid-nopatch 120 60 $kvf --model tiny-hybrid --no-patch
    call kvfail-hybrid-fail 120 60 $kvf --model tiny-hybrid --policy fail
    lim=$(($(left) - 200))
    [ "$lim" -gt 200 ] && lim=200
    say "fp32: gpu/repro_kv_fail.py v2-eager-fp32 v2-eager-fp32-nopatch (limit ${lim}s)"
    (cd "$RUN_CWD" && timeout -k 20 -s INT "$lim" python3 "$REPO/gpu/repro_kv_fail.py" --out "$D/fp32.json" --budget "$((lim - 20))" v2-eager-fp32 v2-eager-fp32-nopatch) >"$D/fp32.txt" 2>"$D/fp32.err"
    say "fp32 rc=$?: $(cut -c1-300 "$D/fp32.txt" | tr '\n' ';')"
    call certify-llama 200 120 certify --model tiny-llama --json --no-tui --junit "$D/certify.xml" --sarif "$D/certify.sarif" --timeout @T
    ;;
images)
    facts
    build tiny-vlm-multi tiny-vlm
    call mm-uuid-vlm 150 80 diag mm-uuid --model tiny-vlm-multi --json --no-tui
    call invariance-vlm 130 70 diag invariance --model tiny-vlm-multi --mode default --json --no-tui --timeout @T
    call lora-vlm 130 70 diag lora --model tiny-vlm-multi --json --no-tui --timeout @T
    call lora-blip2 130 70 diag lora --model tiny-vlm --json --no-tui --timeout @T
    ;;
images2)
    facts
    build tiny-vlm-multi
    call mm-uuid-vlm 300 200 diag mm-uuid --model tiny-vlm-multi --json --no-tui
    call lora-vlm 250 150 diag lora --model tiny-vlm-multi --json --no-tui --timeout @T
    ;;
uuid)
    facts
    build tiny-vlm-multi tiny-vlm
    call mm-uuid-vlm 220 150 diag mm-uuid --model tiny-vlm-multi --json --no-tui
    call mm-uuid-blip2 220 150 diag mm-uuid --model tiny-vlm --json --no-tui
    ;;
hang)
    facts
    build tiny-llama tiny-vlm
    export PATH=/tmp/site/bin:$PATH # py-spy, installed from the carried wheel (stacks --native)
    lim=$(($(left) - 200))
    [ "$lim" -gt 300 ] && lim=300
    say "hang: gpu/hang_gpu.py (limit ${lim}s; py-spy: $(command -v py-spy || echo none))"
    (cd "$RUN_CWD" && timeout -k 20 -s INT "$lim" python3 "$REPO/gpu/hang_gpu.py" --out "$D/hang.json" --budget "$((lim - 20))") >"$D/hang.txt" 2>"$D/hang.err"
    say "hang rc=$?: $(cut -c1-400 "$D/hang.txt" | tr '\n' ';')"
    call lora-blip2 180 100 diag lora --model tiny-vlm --json --no-tui --timeout @T
    ;;
prefill)
    facts
    build tiny-llama
    lim=$(($(left) - 40))
    [ "$lim" -gt 520 ] && lim=520
    say "prefill: gpu/prefill_gpu.py (limit ${lim}s)"
    (cd "$RUN_CWD" && timeout -k 20 -s INT "$lim" python3 "$REPO/gpu/prefill_gpu.py" --out "$D/prefill.json" --budget "$((lim - 20))") >"$D/prefill.txt" 2>"$D/prefill.err"
    say "prefill rc=$?: $(cut -c1-600 "$D/prefill.txt" | tr '\n' ';')"
    ;;
fidelity)
    facts
    build tiny-llama tiny-hybrid
    [ -n "${OPSCTL_PROVE_LOCAL:-}" ] && export OPSCTL_ENGINE_LOCK=${OPSCTL_ENGINE_LOCK:-/tmp/opsctl-engine.lock}
    mem=()
    # several engines on one GPU: a small share each, and a fixed KV cache (vLLM's memory
    # profiling fails when another engine frees memory meanwhile, as a dying one does)
    [ -z "${OPSCTL_PROVE_LOCAL:-}" ] && mem=(--gpu-memory-utilization "${FIDELITY_GPU_MEMORY:-0.08}" --kv-cache-memory-bytes "${FIDELITY_KV_BYTES:-1073741824}")
    kvf="diag kv-fail --mode ${FIDELITY_MODE:-default} --json --no-tui --timeout 300s"
    export NO_COLLECT=1
    python3 "$REPO/gpu/fidelity_gpu.py" plan "${FIDELITY_SEEDS:-0-9}" >"$D/plan.txt"
    while read -r name args; do
        # shellcheck disable=SC2086 # $kvf and $args are word lists
        call "$name" "$(($(left) - 30))" 60 $kvf $args "${mem[@]}" &
        sleep "${FIDELITY_STAGGER:-3}"
    done <"$D/plan.txt"
    wait
    unset NO_COLLECT
    python3 "$REPO/gpu/fidelity_gpu.py" collect "$D"
    for rd in "$D"/runs/*/; do [ -d "$rd" ] && engine_facts "$rd"; done
    python3 "$REPO/gpu/fidelity_gpu.py" matrix "$D" 2>&1 | tee -a "$SUMMARY"
    ;;
certify)
    build tiny-llama
    call certify-llama 420 200 certify --model tiny-llama --json --no-tui --junit "$D/certify.xml" --sarif "$D/certify.sarif" --timeout @T
    call invariance-default 220 150 diag invariance --model tiny-llama --mode default --json --no-tui --timeout @T
    ;;
esac
cleanup "stage $STAGE"
say "vLLM processes at the end: $(vllm_ps | tr '\n' ';')"
say "stage $STAGE done in $(($(date +%s) - T_START))s"
rm -f "$D"/.runs-*
cp "$SUMMARY" "$OUT/$STAGE.log"
tar -czf "$OUT/$STAGE.tar.gz" -C "$WORK" "$STAGE"
ls -la "$OUT/$STAGE.tar.gz"
