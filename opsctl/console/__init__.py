"""The fleet console: where endpoints come from and the sources that watch them.

Endpoints come from URL arguments, a TOML targets file, and discovery of local vLLM
servers and opsctl runs; the FleetSource interface turns them into FleetSnapshots
(direct scraping, Prometheus, or a replay)."""
