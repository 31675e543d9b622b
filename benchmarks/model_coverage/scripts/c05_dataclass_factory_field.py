"""A training config dataclass with a nested model config (default_factory)."""
from dataclasses import dataclass, field

import torch
import torch.nn as nn


@dataclass
class ModelConfig:
    input_dim: int = 40
    hidden: int = 300
    layers: int = 2
    classes: int = 29


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    batch_size: int = 24
    lr: float = 3e-4


class SpeechGRU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.rnn = nn.GRU(cfg.input_dim, cfg.hidden, cfg.layers, batch_first=True)
        self.proj = nn.Linear(cfg.hidden, cfg.classes)

    def forward(self, x):
        return self.proj(self.rnn(x)[0])


def main(cfg: TrainConfig):
    model = SpeechGRU(cfg.model).to(torch.device("cuda"))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)


if __name__ == "__main__":
    main(TrainConfig())
