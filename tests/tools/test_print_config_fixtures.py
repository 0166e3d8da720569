"""tools/print_config_fixtures.py: a key added is written, a key removed or a value changed is
refused unless asked (tests/config/test_print_config_fixture.py holds the fixtures themselves)."""

from conftest import load_tool

tool = load_tool("print_config_fixtures")


def test_the_differences_are_named_by_dotted_key():
    old = {"train": {"max_steps": 10, "seed": 0}, "log": {"tensorboard": True}}
    new = {"train": {"max_steps": 20, "smoke": False}, "log": {"tensorboard": True}, "extra": {"a": 1}}
    assert tool.differences(old, new) == {"added": ["extra", "train.smoke"], "removed": ["train.seed"],
                                          "changed": ["train.max_steps"]}
    assert tool.differences(old, old) == {"added": [], "removed": [], "changed": []}


def test_a_change_is_refused_and_nothing_written(tmp_path, monkeypatch, capsys):
    fixture = tmp_path / "demo.yaml"
    fixture.write_text("train:\n  max_steps: 1\n")
    monkeypatch.setattr(tool, "FIXTURES", tmp_path)
    monkeypatch.setattr("segadv.config.shipped.config_names", lambda: ["demo"])
    monkeypatch.setattr(tool, "printed", lambda name: "train:\n  max_steps: 2\n  smoke: false\n")
    assert tool.main([]) == 1
    assert fixture.read_text() == "train:\n  max_steps: 1\n"
    assert "demo: added train.smoke" in capsys.readouterr().out
    assert tool.main(["--allow-changes"]) == 0
    assert "smoke: false" in fixture.read_text()

