"""CLI commands. Each module exposes ``register(app)`` and keeps heavy imports inside functions."""
