from opsctl.domain.serverlog import PHASES, argparse_error, decisive_lines, load_progress

HEALTHY_LOG = """\
(APIServer pid=1) INFO [api_utils.py:347] vLLM API server version 0.32.0
(EngineCore pid=2) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...
(Worker pid=3) INFO [cpu_model_runner.py:68] Starting to load model /m...
(Worker pid=3) INFO [default_loader.py:501] Loading weights took 0.25 seconds
(EngineCore pid=2) INFO [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens
(EngineCore pid=2) INFO [core.py:402] init engine (profile, create kv cache, warmup model) took 3.56 s
(APIServer pid=1) INFO [entry.py:140] Starting vLLM server on http://127.0.0.1:8123
INFO:     Application startup complete.
"""


def test_load_progress_walks_every_phase_and_reads_timings():
    p = load_progress(HEALTHY_LOG)
    assert (p.phase, p.step, p.total) == ("ready", len(PHASES), len(PHASES))
    assert p.weights_seconds == 0.25
    assert p.engine_init_seconds == 3.56


def test_load_progress_partial_log_stops_at_last_phase():
    lines = HEALTHY_LOG.splitlines()
    p = load_progress("\n".join(lines[:3]))
    assert p.phase == "loading model" and p.step == 3 and p.weights_seconds is None


def test_load_progress_empty_log_is_starting():
    assert load_progress("").phase == "starting"


def test_decisive_lines_pick_the_exception_not_frames_or_warnings():
    log = """\
/x/resource_tracker.py:254: UserWarning: resource_tracker: leaked
Traceback (most recent call last):
  File "/x/core.py", line 10, in run
    raise RuntimeError("boom")
(EngineCore pid=7) RuntimeError: Scheduler._handle_invalid_blocks: multi-group
(APIServer pid=6) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
"""
    lines = decisive_lines(log)
    assert lines[-1].startswith("APIServer: vllm.v1.engine.exceptions.EngineDeadError")
    assert any("RuntimeError: Scheduler._handle_invalid_blocks" in x for x in lines)
    assert not any("UserWarning" in x or x.startswith("File") for x in lines)


def test_decisive_lines_empty_when_no_error():
    assert decisive_lines(HEALTHY_LOG) == []


def test_argparse_error_extracted():
    log = "usage: api_server.py [-h] ...\napi_server.py: error: unrecognized arguments: --bogus-flag 3\n"
    assert argparse_error(log) == "unrecognized arguments: --bogus-flag 3"
    assert argparse_error(HEALTHY_LOG) is None


def test_decisive_lines_skip_warnings_and_keep_validation_detail():
    log = (
        "(APIServer pid=5) WARNING 11-30 01:38:56 [system_utils.py:255] Found ulimit ... "
        "`OSError: [Errno 24] Too many open files`.\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, User-specified max_model_len (100000) is greater than the derived max_model_len\n"
        "    For further information visit https://errors.pydantic.dev\n"
    )
    lines = decisive_lines(log)
    assert len(lines) == 1
    assert "ValidationError" in lines[0] and "max_model_len (100000)" in lines[0]


def test_port_taken_reads_the_api_servers_and_torchs_bind_failures():
    from opsctl.domain.serverlog import port_taken

    # CI's log (vLLM's create_server_socket) and torch.distributed's TCPStore
    assert port_taken("(APIServer pid=7) OSError: [Errno 98] Address already in use\n")
    assert port_taken(
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
        "local network address. port: 45197, useIPv6: 0, code: -98, name: EADDRINUSE, "
        "message: address already in use\n"
    )
    assert not port_taken("OSError: [Errno 99] Cannot assign requested address\n")
    assert not port_taken("INFO Starting vLLM server on http://127.0.0.1:45197\n")
