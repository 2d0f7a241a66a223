"""Starting and supervising vLLM's OpenAI API server as a child process.

Serve's machinery, shared by every diag that starts its own engine."""
