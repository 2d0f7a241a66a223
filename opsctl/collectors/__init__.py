"""Collectors do I/O only (psutil, /proc, /dev/shm, HTTP) and return frozen snapshots."""
