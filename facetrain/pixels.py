"""The pixel normalization every model of facetrain sees: (x - 127.5) / 127.5 on 0-255 RGB values.

It is insightface arcface_torch's, so its released backbones get the inputs they were trained on. The
data pipeline applies it (`facetrain.data.transforms`), a backbone with another convention undoes it
(`facetrain.models.dlib_resnet`), and an exported card records it; each reads the constants here.
"""

PIXEL_MEAN = 127.5
PIXEL_SCALE = 127.5
PIXEL_MAX = 255.0  # insightface first scales to [0, 1], then normalizes by MEAN / MAX and SCALE / MAX
