"""model.generator.encoder_weights with the files people have (torchvision's and timm's ImageNet
ResNets, their fc head included), the hint for a file that does not fit, and an offline machine
told at once instead of after the Hub client's retries. No test here touches the network."""

from __future__ import annotations

import logging
import socket

import pytest
import torch

from segadv.checkpoint import load_encoder_weights
from segadv.checkpoint.loader import load_weights
from segadv.config.schema import GeneratorConfig
from segadv.errors import UserError
from segadv.models.deeplab import weights as generator_module
from segadv.models.generator import build_generator


def classifier_state_dict(kind: str) -> dict[str, torch.Tensor]:
    if kind == "torchvision":
        import torchvision

        return torchvision.models.resnet18(weights=None).state_dict()
    import timm

    return timm.create_model("resnet18", pretrained=False).state_dict()


@pytest.mark.parametrize("kind", ["torchvision", "timm"])
def test_an_imagenet_resnet_with_its_fc_head_loads_into_the_encoder_said_in_one_line(kind, tmp_path, caplog):
    state = classifier_state_dict(kind)
    assert {"fc.weight", "fc.bias"} <= set(state)
    path = tmp_path / f"{kind}_resnet18.pth"
    torch.save(state, path)
    cfg = GeneratorConfig(encoder="resnet18", encoder_weights=str(path))
    generator = build_generator(cfg.model_copy(update={"encoder_weights": None}), 3)
    with caplog.at_level(logging.INFO):
        load_encoder_weights(generator, cfg)
    encoder = generator.encoder.state_dict()
    assert torch.equal(encoder["conv1.weight"], state["conv1.weight"])
    assert torch.equal(encoder["layer4.1.bn2.running_var"], state["layer4.1.bn2.running_var"])
    lines = [r.getMessage() for r in caplog.records if "classifier head" in r.getMessage()]
    assert lines == [f"model.generator.encoder_weights: the classifier head of {path.name} (fc.bias, fc.weight: "
                     "1000 classes) is not part of the encoder: left out"]


def test_a_file_that_does_not_fit_the_encoder_names_the_right_key(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"features.0.weight": torch.zeros(8, 3, 4, 4)}, path)
    cfg = GeneratorConfig(encoder="resnet18", encoder_weights=str(path))
    generator = build_generator(cfg.model_copy(update={"encoder_weights": None}), 3)
    with pytest.raises(UserError) as err:
        load_encoder_weights(generator, cfg)
    message = str(err.value)
    assert message.startswith("model.generator.encoder_weights:")
    assert "model.generator.encoder_weights takes an encoder's weights" in message
    assert "init.generator.path" in message and "exclude" not in message


def test_a_generator_file_that_does_not_fit_says_what_exclude_does():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 2, 1))
    with pytest.raises(UserError) as err:
        load_weights({"0.weight": torch.zeros(4, 3, 3, 3), "0.bias": torch.zeros(4)}, model, role="generator")
    message = str(err.value)
    assert "list them as glob patterns in init.generator.exclude: those keys are not loaded" in message
    assert "keys to keep" not in message


@pytest.fixture
def no_network(monkeypatch):
    """The Hub's cache empty and any real download a test failure."""
    from huggingface_hub.errors import LocalEntryNotFoundError
    from segmentation_models_pytorch import encoders

    calls = []

    def from_cache(repo_id, filename, revision=None, local_files_only=False, **kwargs):
        calls.append((filename, local_files_only))
        if not local_files_only:
            pytest.fail("a download was tried")
        raise LocalEntryNotFoundError("not in the cache")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", from_cache)
    monkeypatch.setattr(encoders, "hf_hub_download", from_cache)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_an_offline_machine_is_told_at_once_with_one_short_probe(no_network, monkeypatch):
    probes = []

    def unreachable(address, timeout=None):
        probes.append((address, timeout))
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    with pytest.raises(UserError) as err:
        build_generator(GeneratorConfig(encoder="resnet18", encoder_weights="imagenet"), 3)
    message = str(err.value)
    assert "'imagenet' weights for encoder 'resnet18' are not in the Hugging Face cache" in message
    assert "huggingface.co cannot be reached (Network is unreachable): this machine looks offline" in message
    assert "local file" in message and "encoder_weights=null" in message
    assert probes == [(("huggingface.co", 443), generator_module.PROBE_TIMEOUT_S)]
    assert generator_module.PROBE_TIMEOUT_S <= 5


def test_hf_hub_offline_is_told_without_any_probe(no_network, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed while offline"))
    with pytest.raises(UserError, match="HF_HUB_OFFLINE is set, so nothing is downloaded"):
        generator_module.check_weights_reachable("resnet18", "imagenet")


def test_weights_in_the_cache_need_no_network(monkeypatch):
    cached = []
    monkeypatch.setattr("huggingface_hub.hf_hub_download",
                        lambda repo_id, filename, revision=None, local_files_only=False: cached.append(filename))
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed with the weights cached"))
    generator_module.check_weights_reachable("resnet18", "imagenet")
    assert cached == ["config.json", "model.safetensors"]
