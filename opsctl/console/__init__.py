"""The fleet console: where endpoints come from and the sources that watch them.

The fleet console: where endpoints come from (URL arguments, a TOML targets file,
discovery of local vLLM servers and opsctl runs) and the FleetSource interface that
turns them into FleetSnapshots (direct scraping here; a Prometheus source later)."""
