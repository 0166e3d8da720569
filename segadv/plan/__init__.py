"""segadv-plan: a placement planned before the GPUs exist (docs/planning.md).

segadv's own iteration (the configured method, per-network autocast and scalers) runs under fake
tensors on stand-in devices, one per CUDA device of the map; every tensor's device is checked
against the map as it is made, and live storage bytes are counted per device.
"""
