"""UniMatch and UniMatch V2: ``declaration.py`` (torch-free), ``views.py`` (the strong views, the
CutMix boxes and the feature scales) and ``iteration.py``."""
