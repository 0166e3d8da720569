"""The shipped configs as package data: pyproject installs this directory as ``segadv.configs``
(see segadv/config/shipped.py)."""
