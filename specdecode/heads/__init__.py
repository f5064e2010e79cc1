"""Draft heads on the target's features: EAGLE, Medusa and MTP modules, their config and their files."""

from specdecode.heads.config import HEAD_KINDS, HeadConfig
from specdecode.heads.io import build_heads, load_heads, save_heads

__all__ = ["HEAD_KINDS", "HeadConfig", "build_heads", "load_heads", "save_heads"]
