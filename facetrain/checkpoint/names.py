"""The keys of a checkpoint's tensors: what a reader outside training (export, import) needs to know.

Under `app.` (the one Stateful a checkpoint saves, `facetrain.checkpoint.app_state`): `model.backbone.K`
the trained backbone, `model.head.weight` the head as one C x (K x D) tensor (a row per class, its
sub-centers side by side) written in row ranges by the ranks that hold them, `ema.K` the weight
average when the run kept one, `optim.state.<param>.<state>` torch.optim's state by parameter name
(`head.weight` for the head, per class like its weight), `scaler.<x>` and `rng.<rank>.<device>`.

meta.json holds where the run was, `TRAIN_STATE_KEYS`: the trainer's own `state_dict()`, written and
read back as it is.
"""

PREFIX = "app."
BACKBONE = "app.model.backbone."
HEAD_PREFIX = "app.model.head."
HEAD_WEIGHT = "app.model.head.weight"
MARGIN_STATE = "app.model.head.margin_state."  # the margin's running values, 0-dim each
EMA = "app.ema."
OPTIM_STATE = "app.optim.state."
HEAD_STATE = "app.optim.state.head.weight."
TRAIN_STATE_KEYS = ("step", "epoch", "consumed", "best_accuracy", "best_step")
