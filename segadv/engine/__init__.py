"""Training and evaluation machinery: per-network optimisation, the adversarial step, metrics."""
