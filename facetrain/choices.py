"""Names and defaults that command-line options offer, importable without torch, numpy or cv2.

The CLI builds its options (and prints `--help`) from these without importing the code behind them,
which would cost seconds; that code imports the same objects from here, so each list lives once.
"""

# insightface's IResNet depths by backbone name: blocks in each of the four stages
IRESNET_DEPTHS = {
    "iresnet18": (2, 2, 2, 2),
    "iresnet34": (3, 4, 6, 3),
    "iresnet50": (3, 4, 14, 3),
    "iresnet100": (3, 13, 30, 3),
    "iresnet200": (6, 26, 60, 6),
}

# what `facetrain import insightface --arch` takes: insightface's IResNets and its MobileFaceNet
INSIGHTFACE_ARCHITECTURES = (*IRESNET_DEPTHS, "mbf")

# cross-validation folds of a pair set without its own, and the seed that deals them
DEFAULT_FOLDS = 10
DEFAULT_FOLD_SEED = 0

# where `facetrain bench` commands run
DEVICE_CHOICES = ("auto", "cpu", "cuda")

# the autocast dtypes by name (train/step.py), what `facetrain bench head --precision` takes
PRECISIONS = ("fp32", "bf16", "fp16")
# train.precision and `facetrain bench train --precision`: those, or auto, which the device decides
# (bf16 where it computes bf16 natively, else fp32: facetrain.train.device_defaults)
TRAIN_PRECISIONS = (*PRECISIONS, "auto")

# the built-in synthetic face set (data.synth, `facetrain synth`'s options): identities and images
SYNTH_DEFAULTS = {
    "identities": 200,
    "images_per_identity": 24,
    "heldout_identities": 60,
    "heldout_images_per_identity": 10,
    "pairs_folds": 10,
    "pairs_per_fold": 60,
    "image_size": 112,
    "seed": 0,
}
