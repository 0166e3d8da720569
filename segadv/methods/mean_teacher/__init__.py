"""Mean teacher (issue 47): ``declaration.py`` (torch-free) and ``iteration.py``."""
