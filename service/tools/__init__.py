"""Tools around the daemon, not the daemon: the embedded broker, the quickstart, perf-test, the read-back."""
