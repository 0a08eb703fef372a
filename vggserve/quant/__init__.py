"""8-bit quantisation for the FP8 engine: e4m3 numerics (e4m3.py), scales and calibration."""
