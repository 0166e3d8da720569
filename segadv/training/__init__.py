"""The run around the loop: the checks a start makes, the build, the run dir and its lock, the
process set-up, the run's set-up (segadv/training/session.py), the stop decision
(segadv/training/stopping.py) and the loop itself (segadv/training/loop.py)."""
