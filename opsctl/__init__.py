"""opsctl: operator's command line and terminal dashboard for vLLM."""

__version__ = "0.1.0"
