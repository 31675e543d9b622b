from dataclasses import dataclass


@dataclass
class Config:
    vocab: int = 32000
    dim: int = 512
    heads: int = 8
    batch_size: int = 32
    seq_len: int = 128
    device: str = "cuda"
