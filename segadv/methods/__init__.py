"""Training methods: what one iteration does, one class each (docs/methods.md).

A method's class declares what the run needs before any network exists (its name, its config
section, the data streams it draws from, whether G's loss passes through a D, its config checks:
``segadv.methods.base.Method``) and, built, draws its batches itself (some only on some
iterations) and returns its detached losses. Methods get the trained networks as records
(``segadv.engine.network.Network``) and share what every adversarial method does
(``segadv.methods.adversarial``). ``segadv.methods.registry`` maps ``method.name`` to the class.
"""

from segadv.methods.base import Method, PanelMaps, TrainingViews
from segadv.methods.registry import METHODS, method_class, register_method

__all__ = ["METHODS", "Method", "PanelMaps", "TrainingViews", "method_class", "register_method"]
