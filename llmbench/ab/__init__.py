"""Interleaved A/B runs (`llmbench ab`): two sides of one benchmark — two servers, two engine
configurations or two builds of llmbench — run alternately in fresh processes, rounds paired, and
judged on the paired differences."""
