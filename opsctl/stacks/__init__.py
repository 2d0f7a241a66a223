"""The stacks room: ``opsctl stacks``, where each process of a local vLLM server waits.

One file per role, as a check's folder (tests/unit/test_layers.py holds each to its
layer): ``judge.py`` parses and groups the stacks, ``judge_verdict.py`` names the stuck
rank (both pure), ``collect.py`` takes the dumps (py-spy, faulthandler: I/O), ``run.py``
the library call (``run``, ``merge``), ``view.py`` the renderer, ``flags.py`` the Typer
command (registered by opsctl/cli.py).
"""
