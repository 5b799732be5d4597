"""The command line, the top layer: parse, call one layer below, print."""
