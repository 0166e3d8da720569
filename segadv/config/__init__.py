"""Experiment config: the typed schema and how it is loaded, overridden, validated and saved."""

from segadv.config.loading import (
    CONFIGS_DIR,
    DEFAULT_CONFIG_PATH,
    config_from_dict,
    config_to_dict,
    dump_config,
    load_config,
)
from segadv.config.schema import Config

__all__ = [
    "CONFIGS_DIR",
    "DEFAULT_CONFIG_PATH",
    "Config",
    "config_from_dict",
    "config_to_dict",
    "dump_config",
    "load_config",
]
