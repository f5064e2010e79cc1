"""Head files: head.json (config + manifest) and heads.safetensors, written atomically, checked on load."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specdecode.atomic_dir import write_atomically
from specdecode.config import ConfigError
from specdecode.heads.config import HeadConfig
from specdecode.heads.eagle import EagleHead
from specdecode.heads.medusa import MedusaHeads
from specdecode.heads.mtp import MtpHeads
from specdecode.models.llama import LlamaModel

CONFIG_FILE = "head.json"
WEIGHTS_FILE = "heads.safetensors"


def build_heads(cfg: HeadConfig) -> nn.Module:
    return {"eagle": EagleHead, "medusa": MedusaHeads, "mtp": MtpHeads}[cfg.kind](cfg)


def save_heads(module: nn.Module, cfg: HeadConfig, out_dir: str | Path, manifest: dict) -> Path:
    """Written atomically (a crash never leaves a half-written head directory); a checkpoint inside is kept."""

    def fill(tmp: Path) -> None:
        state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
        save_file(state, tmp / WEIGHTS_FILE)
        (tmp / CONFIG_FILE).write_text(json.dumps({"config": cfg.to_json(), "manifest": manifest}, indent=1))

    return write_atomically(Path(out_dir), fill)


def load_heads(path: str | Path, target: LlamaModel, device: str | torch.device, dtype: torch.dtype):
    """(module in eval mode, HeadConfig, manifest) for the heads at `path`, checked against `target`."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise ConfigError(f"{path} is not a head directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        data = json.loads((path / CONFIG_FILE).read_text())
        cfg = HeadConfig.from_json(data["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path / CONFIG_FILE}: unreadable head config ({e})") from None
    cfg.check_target(target.cfg)
    module = build_heads(cfg)
    try:
        module.load_state_dict(load_file(path / WEIGHTS_FILE), strict=True)
    except RuntimeError as e:
        raise ConfigError(f"{path / WEIGHTS_FILE}: weights do not fit the config ({str(e).splitlines()[0]})") from None
    return module.to(device=device, dtype=dtype).eval(), cfg, data.get("manifest", {})
