"""Planning: the alpha-beta cost model and its calibration."""
