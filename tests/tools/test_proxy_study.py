"""tools/proxy_study.py's arithmetic: the regret of a score's pick in the score's direction, the
last checkpoint's, and the pooled table's counts over every grid's runs."""

from conftest import load_tool

study = load_tool("proxy_study")


def checkpoint(step, miou, entropy, flip):
    return {"step": step, "mIoU": miou, "proxy/entropy": entropy, "proxy/flip_agreement": flip}


# The labels pick step 2 (0.60). Entropy is lowest there (lower is better): regret 0. Flip agreement
# is highest at step 1 (0.50): regret 0.10. The last checkpoint (0.55): regret 0.05.
RUN = [checkpoint(1, 0.50, 0.30, 0.95), checkpoint(2, 0.60, 0.20, 0.90), checkpoint(3, 0.55, 0.25, 0.80)]


def test_regret_reads_each_score_in_its_direction():
    assert study.regret(RUN, "proxy/entropy") == 0.0
    assert abs(study.regret(RUN, "proxy/flip_agreement") - 0.10) < 1e-12
    assert abs(study.regret(RUN, "last") - 0.05) < 1e-12


def test_pooled_counts_every_grids_runs_and_skips_a_score_a_run_lacks():
    labels_last = [checkpoint(1, 0.4, 0.1, 0.9), checkpoint(2, 0.7, 0.2, 0.5)]
    report = {"a": {"scores": {"row": {"seed0": RUN}}},
              "b": {"scores": {"row": {"seed0": labels_last, "seed1": [{"step": 1, "mIoU": 0.3}]}}}}
    rows = {line.split(" | ")[0].lstrip("| "): line for line in study.pooled(report).splitlines()[2:]}
    assert rows["proxy/entropy"] == "| proxy/entropy | 1 / 2 | 15.00 | 30.0 |"
    assert rows["last"] == "| last | 2 / 3 | 1.67 | 5.0 |"
    assert "proxy/snd" not in rows  # no run logged it
