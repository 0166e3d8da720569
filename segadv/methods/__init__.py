"""Training methods: what one iteration does, one module each (docs/methods.md).

A method names the data streams it draws from, draws its batches itself (some are drawn only on
some iterations) and returns its detached losses. Methods get the trained networks as records
(``segadv.engine.network.Network``) and share what every adversarial method does
(``segadv.methods.adversarial``); they differ only in their iteration.
"""

from segadv.methods.base import Method, PanelMaps
from segadv.methods.registry import (
    METHODS,
    build_method,
    check_method_config,
    has_aux_discriminator,
    passes_generator_loss_through_discriminator,
    stream_batch_sizes,
)

__all__ = ["METHODS", "Method", "PanelMaps", "build_method", "check_method_config", "has_aux_discriminator",
           "passes_generator_loss_through_discriminator", "stream_batch_sizes"]
