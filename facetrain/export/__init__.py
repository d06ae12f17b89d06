"""What users take away from training (layer 3): `facetrain export` (exporter.py: a checkpoint to the
formats of `facetrain.interop`, with its card and head), `embed` (embed_paths.py, embedding_files.py) and
`compare` (compare.py). Loading any model for inference is `facetrain.interop.load_model`."""
