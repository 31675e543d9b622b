"""A LightningModule (a stack of 2048 -> 8192 -> 2048 MLP blocks, the feed-forward half of a transformer)
trained by a Lightning Trainer from a CPU TensorDataset read a batch at a time (one indexing per batch),
at the Trainer's default precision (fp32).
`tcaudit verify` runs it on the device (BENCHMARKS.md, "Frameworks that own the loop")."""

import lightning as L
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


class Blocks(L.LightningModule):
    def __init__(self, width=2048, depth=4):
        super().__init__()
        self.net = nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                   for _ in range(depth)])

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32768, 2048, generator=g)
        data = TensorDataset(x, x.roll(1, dims=1))
        batches = BatchSampler(RandomSampler(data), batch_size=2048, drop_last=True)
        return DataLoader(data, sampler=batches, batch_size=None)


if __name__ == "__main__":
    trainer = L.Trainer(accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=1, max_steps=10_000,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Blocks())
