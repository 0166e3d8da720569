"""smp's named encoder weights ("imagenet") as a DeepLab G's builder fetches them: found in the
Hugging Face cache, or refused at once on a machine that cannot reach the Hub."""

from __future__ import annotations

from segadv.errors import UserError

# How long the one probe of the weights' host may take before the machine counts as offline.
PROBE_TIMEOUT_S = 3.0
OFFLINE_HINT = ("on an offline machine give model.generator.encoder_weights a local file (smp's encoder, or "
                "torchvision's or timm's ImageNet ResNet state dict: its fc head is left out), copy the Hugging "
                "Face cache over from a machine that has it, or set model.generator.encoder_weights=null to "
                "train from scratch")


def check_weights_reachable(encoder: str, weights: str) -> None:
    """Before smp fetches named weights ("imagenet") from the Hugging Face Hub, whose client
    retries for tens of seconds on a machine without a network: pass when they are in the local
    cache; else a UserError at once when the Hub is set offline (``HF_HUB_OFFLINE``) or its host
    does not answer one connection within :data:`PROBE_TIMEOUT_S`. Behind a proxy the probe is
    left to the download itself."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, hf_hub_download
    from segmentation_models_pytorch.encoders import encoders

    settings = encoders.get(encoder, {}).get("pretrained_settings", {}).get(weights)
    if settings is None or "repo_id" not in settings:
        return  # smp's own error names the encoders and weights it knows (a KeyError, made a UserError by the caller)
    repo, revision = settings["repo_id"], settings.get("revision")
    try:
        for filename in ("config.json", "model.safetensors"):
            hf_hub_download(repo, filename=filename, revision=revision, local_files_only=True)
        return  # downloaded before: no network needed
    except Exception:  # not in the cache (LocalEntryNotFoundError, or a cache it cannot read)
        pass
    what = f"model.generator.encoder_weights: {weights!r} weights for encoder {encoder!r} are not in the " \
           f"Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise UserError(f"{what} and HF_HUB_OFFLINE is set, so nothing is downloaded; {OFFLINE_HINT}")
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as err:
        raise UserError(f"{what} and {host} cannot be reached ({err.strerror or err}): this machine looks "
                        f"offline; {OFFLINE_HINT}") from None
