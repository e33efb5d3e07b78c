"""The node agent's Prometheus exporter: ``region`` reads the accounting regions written by
the interposer, ``collector`` turns them, the allocations and NVML into metrics."""
