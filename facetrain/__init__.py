"""facetrain: face recognition and re-id training with a class-sharded margin-softmax head."""

__version__ = "0.1.0"
