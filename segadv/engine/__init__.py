"""Training and evaluation machinery: the network record, per-network optimisation, losses, metrics."""
