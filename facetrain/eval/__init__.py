"""How users learn whether a model is any good (layer 1): verification on pairs, re-id retrieval and
IJB-B/C template verification (whose face alignment the caller passes in).

Entry points: `facetrain.eval.verify_pairs` (`load_pairs`, `verify`, `embed_images`),
`facetrain.eval.retrieval` (`evaluate_market1501`, `retrieval_metrics`) and `facetrain.eval.report`
(tables and report files). The metric cores in `metrics` and `retrieval` need only arrays. The `eval`
section of a run's config is `facetrain.eval.config.EvalConfig`.
"""
