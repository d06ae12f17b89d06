"""Model files in and out of facetrain (layer 2): every format it reads or writes, and the one way to
load a model.

- `load_model` (loading.py): a training checkpoint, an export directory or an exported file, as a
  backbone ready for inference; `facetrain eval`, `embed`, `compare`, `export`, `outliers`, `train
  --init` and distillation's teacher use it. It is the only public loader: checkpoint/ gives it the
  pieces (the saved model and data sections, the weights), train/ adds `--init`'s strict fit check.
- facetrain's own export formats: the model card (card.py), safetensors, TorchScript and ONNX, with the
  parity check each export passes (parity.py).
- Foreign formats that `facetrain import` turns into facetrain checkpoints: insightface's .pth files,
  .onnx files (read through onnx_graph.py, without onnxruntime) and training run folders; dlib's .dat
  face-recognition network. An import's config.yaml holds only the sections it knows
  (imported_config.py: model, data, and for a run head and optim's name), built from the components'
  own sections (models/, data/, heads/); a run reading it fills the rest from its defaults.

Above checkpoint/ in its layer: the importers write checkpoints and `load_model` reads them. Nothing
here imports train/ or export/: the run's whole config tree is theirs.
"""

from facetrain.interop.loading import LoadedModel, load_model

__all__ = ["LoadedModel", "load_model"]
