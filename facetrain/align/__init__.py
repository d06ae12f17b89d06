"""Face alignment (layer 1): raw photos in, crops aligned the way insightface-trained models expect them.

A face is detected (dlib's HOG or CNN detector), five landmarks are found (eye centres, nose tip,
mouth corners, derived from dlib's 68-point shape predictor), and the photo is warped by the
similarity transform that best maps them onto the ArcFace reference points. dlib and its model
files come with the optional extra `pip install 'facetrain[align]'`.

Entry points: `facetrain.align.aligner.FaceAligner` (one image),
`facetrain.align.runner.align_folder` (a tree of images, several processes) and
`facetrain.align.five_points.FivePointCrop` (a photo whose five landmarks are given, as IJB's).
"""
