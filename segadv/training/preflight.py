"""What a start of ``segadv-train`` checks before anything slow (building networks, fetching
pretrained weights, reading checkpoints): the method against the model and the data, the data
roots and layouts (listed, no file opened), each stream's batch against its pool, and the files
the config names (``init.*``, a local ``model.generator.encoder_weights``, ``--resume PATH``).
A mistake in any of them is one UserError naming the key, before a download's retries or a
network's build: ``segadv-train --config voc data.root=/nonexistent`` answers at once. The
device map is parsed before this (segadv/training/loop.py ``start_processes``)."""

from __future__ import annotations

from segadv.config import Config
from segadv.config.schema import DataConfig
from segadv.errors import UserError
from segadv.fsutil import user_path


def check_start(cfg: Config, resume: str | None, world_size: int = 1) -> None:
    """Every cheap check of a start, in the order a user would fix them."""
    from segadv.training.build import check_accumulation
    from segadv.methods import method_class

    method_class(cfg.method.name).check_config(cfg)
    check_accumulation(cfg)
    check_files(cfg, resume)
    check_data(cfg.data, "data", cfg.data.batch_size, world_size)
    if cfg.target_data is not None:
        check_data(cfg.target_data, "target_data", None, world_size)


def check_files(cfg: Config, resume: str | None) -> None:
    """The weights files the config names, and ``--resume PATH``, exist."""
    from segadv.models.generator import local_encoder_weights

    local_encoder_weights(cfg.model.generator)  # a path that does not exist is a UserError naming the key
    for role in ("generator", "discriminator"):
        source = getattr(cfg.init, role)
        if source is not None and not user_path(source.path, f"init.{role}.path").exists():
            raise UserError(f"init.{role}.path: checkpoint not found: {source.path}")
    if resume not in (None, "auto") and not user_path(resume, "--resume").is_file():
        raise UserError(f"--resume {resume}: no such checkpoint file (--resume auto finds the newest in the run dir)")


def check_data(cfg: DataConfig, key: str, batch_size: int | None, world_size: int) -> None:
    """A data section against itself, its root, and (``batch_size`` given: the labeled data) its
    layout listed without opening a file and ``batch_size`` against the labeled pool (with
    ``drop_last``; the loaders check every stream again once the headers are read). Target data's
    train masks may be absent, so only its root is looked at here."""
    from segadv.data.config_checks import check_config, data_root

    check_config(cfg)
    if cfg.kind == "synthetic":
        pool = cfg.synthetic.train_size if cfg.labeled_fraction >= 1 else None
        source = f"{key}.synthetic.train_size = {pool}"
    elif batch_size is None:
        try:
            data_root(cfg)
        except UserError as err:
            raise UserError(f"{key}: {err}") from None
        return
    else:
        from segadv.data.listing import collect

        pool = len(collect(cfg).labeled)
        source = f"{pool} labeled samples"
    if batch_size is not None and pool and cfg.drop_last and batch_size > pool // world_size:
        ranks = f" over {world_size} ranks" if world_size > 1 else ""
        raise UserError(f"{key}.batch_size: {batch_size} is larger than the labeled set ({source}{ranks}), so no "
                        "full batch exists")
