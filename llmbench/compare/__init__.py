"""`llmbench compare`: two runs (or two sweeps) judged by gates, with intervals, for CI.

Layer 4. `gates` reads a gates file (metric, statistic, allowed change); `runs` loads and pairs
the runs to compare; `verdict` judges each gate (bootstrap intervals over the repetitions);
`output` and `sweep_output` write the table, Markdown and JUnit a CI job reads.
"""
