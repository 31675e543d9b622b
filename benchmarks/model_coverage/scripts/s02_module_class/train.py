"""from net import Seq2SeqAttn: the class lives in a sibling module, the config in another."""
import torch

from config import Config
from net import Seq2SeqAttn

cfg = Config()
model = Seq2SeqAttn(cfg.vocab, cfg.dim, cfg.heads).to(cfg.device)
src = torch.randint(0, cfg.vocab, (cfg.batch_size, cfg.seq_len), device=cfg.device)
