"""Experiment config: the typed schema and how it is loaded, overridden, validated and saved."""

from segadv.config.loading import (
    config_from_dict,
    config_to_dict,
    dump_config,
    flat_config,
    load_config,
)
from segadv.config.schema import Config
from segadv.config.shipped import (
    CONFIGS_DIR,
    DEFAULT_CONFIG_PATH,
    EXPERIMENTS_DIR,
    config_listing,
    config_names,
    resolve_config,
)

__all__ = [
    "CONFIGS_DIR",
    "DEFAULT_CONFIG_PATH",
    "EXPERIMENTS_DIR",
    "Config",
    "config_from_dict",
    "config_listing",
    "config_names",
    "config_to_dict",
    "dump_config",
    "flat_config",
    "load_config",
    "resolve_config",
]
