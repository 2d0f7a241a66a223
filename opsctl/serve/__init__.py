"""The serve room: ``opsctl serve``'s dashboard over one supervised vLLM server.

One file per role, as a check's folder (tests/unit/test_layers.py holds each to its
layer): ``judge_state.py`` the state machine (pure), ``collect.py`` the snapshot (HTTP,
/proc, the ledger: I/O), ``view_app.py`` the Textual app and ``view_panels.py`` its panels
(the console's drill-in reuses three), ``flags.py`` the Typer command (registered by
opsctl/cli.py). Starting and supervising the engine is the engine layer's
(opsctl/engine/supervise.py).
"""
