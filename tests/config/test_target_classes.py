"""target_data.num_classes must be G's (data.num_classes): a config-level check, exit 2 at start."""

from segadv.cli.train import main as train_main


def test_a_target_with_other_classes_than_g_exits_2_naming_both_keys(capsys):
    assert train_main(["--config", "uda", "target_data.num_classes=4", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "target_data.num_classes=4 differs from data.num_classes=5" in err and "Traceback" not in err
    assert train_main(["--config", "uda", "--print-config"]) == 0
