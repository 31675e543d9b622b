DEFAULTS = {"variant": "tiny", "batch_size": 64, "device": "cuda"}
