"""The harness: specs, workloads, driver, backends, metrics, cost model, results, serving."""
