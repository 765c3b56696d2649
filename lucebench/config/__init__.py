"""Config files: YAML with line-aware errors, validated by a strict pydantic schema."""

from lucebench.config.load import CONFIGS_DIR, LoadedConfig, find_config, load_config
from lucebench.config.schema import AXES, KV_TYPES, Config

__all__ = ["AXES", "CONFIGS_DIR", "KV_TYPES", "Config", "LoadedConfig", "find_config", "load_config"]
