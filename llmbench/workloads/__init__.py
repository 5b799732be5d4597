"""The shipped workloads (YAML), found by name: `llmbench run agentic`."""
