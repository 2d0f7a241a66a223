"""Pure functions: snapshots -> findings/verdicts. No I/O, no UI, no torch/vllm."""
