"""Backends the driver can measure: the in-process engine and OpenAI-compatible servers."""
