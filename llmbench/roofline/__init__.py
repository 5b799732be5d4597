"""The roofline: what the hardware allows and how close a run or an op comes to it.

Layer 2, torch-free except the probes. `ceilings` measures this machine's roofs (bandwidth and
matmul probes, cached per machine); `datasheets` holds vendors' peaks and host links;
`cost_model` counts a step's bytes and FLOPs (napkin maths from the model's shape); `analysis`
places a run's steps under the roofs; `whatif` answers for any model × hardware × batch without
weights; `profile*` attributes one step's time to its ops (`llmbench profile`).
"""
