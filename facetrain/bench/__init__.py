"""`facetrain bench`'s benchmarks (layer 4, imported by nothing but the command line): each measures
facetrain's own code (the head, the data pipeline, a training step, evaluation, pipeline parallelism,
scaling) against its baselines and writes a report."""
