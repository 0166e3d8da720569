"""The supervised method: ``declaration.py`` says what the method needs, ``iteration.py`` runs it."""
