"""What users take away from training: exported models, and loading any model for inference."""

from facetrain.export.loading import LoadedModel, load_model

__all__ = ["LoadedModel", "load_model"]
