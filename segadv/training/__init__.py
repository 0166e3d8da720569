"""The run around the loop: the checks a start makes, the build, the run dir and its lock, the
process set-up and the loop itself (segadv/training/loop.py)."""
