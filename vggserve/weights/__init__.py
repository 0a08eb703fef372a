"""Weights: the VGG16 spec, generated weights, loaders for every supported format, fetching."""
