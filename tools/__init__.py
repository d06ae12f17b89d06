"""The repository's scripts: the demo, accuracy protocols, sweeps and timings (each runs as a script).

A package, so that the tests' `from tools import fuzz_cases` (and fuzz_inputs, head_precision,
ablate_orl) imports this folder from the repository root and nothing else named
`tools` that happens to be on the path. Not installed with facetrain.
"""
