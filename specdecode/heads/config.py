"""What a set of draft heads is: its kind, its size, and the target it belongs to."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specdecode.config import HEAD_KINDS, ConfigError
from specdecode.models.llama import LlamaConfig


@dataclass(frozen=True)
class HeadConfig:
    kind: str
    num_heads: int  # Medusa heads / MTP depths; 1 for EAGLE (one layer reused at every depth)
    target: LlamaConfig  # the target's architecture: the heads read its features and share its LM head

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise ConfigError(f"unknown head kind {self.kind!r}; expected one of {', '.join(HEAD_KINDS)}")
        if self.num_heads < 1:
            raise ConfigError(f"num_heads must be >= 1, got {self.num_heads}")

    def to_json(self) -> dict:
        return {"kind": self.kind, "num_heads": self.num_heads, "target": asdict(self.target)}

    @classmethod
    def from_json(cls, data: dict) -> HeadConfig:
        return cls(data["kind"], int(data["num_heads"]), LlamaConfig(**data["target"]))

    def check_target(self, target: LlamaConfig) -> None:
        """The heads only make sense on the features and vocabulary of the target they were trained on."""
        ours = (self.target.hidden_size, self.target.vocab_size, self.target.num_layers)
        theirs = (target.hidden_size, target.vocab_size, target.num_layers)
        if ours != theirs:
            raise ConfigError(
                f"these {self.kind} heads were trained for a target with (hidden, vocab, layers) = {ours}, not {theirs}"
            )
