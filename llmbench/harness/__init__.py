"""The harness: CLI, workloads, driver, metrics, roofline."""
