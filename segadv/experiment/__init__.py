"""Experiments over runs: ``segadv-experiment`` (a grid of configs x seeds run and tabulated, and
a table of any run dirs, from their ``status.json``) and ``segadv-curves`` (val mIoU against
training time). Nothing here imports torch: these commands read run dirs and launch
``segadv-train`` in subprocesses."""
