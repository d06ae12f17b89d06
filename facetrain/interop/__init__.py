"""Model files in and out of facetrain (layer 2): every format it reads or writes, and the one way to
load a model.

- `load_model` (loading.py): a training checkpoint, an export directory or an exported file, as a
  backbone ready for inference; `facetrain eval`, `embed`, `compare`, `export` and `train --init` use it.
- facetrain's own export formats: the model card (card.py), safetensors, TorchScript and ONNX, with the
  parity check each export passes (parity.py).
- Foreign formats that `facetrain import` turns into facetrain checkpoints: insightface's .pth files,
  .onnx files (read through onnx_graph.py, without onnxruntime) and training run folders; dlib's .dat
  face-recognition network.

Above checkpoint/ in its layer: the importers write checkpoints and `load_model` reads them.
"""

from facetrain.interop.loading import LoadedModel, load_model

__all__ = ["LoadedModel", "load_model"]
