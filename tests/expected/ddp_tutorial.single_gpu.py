"""The single-GPU trainer of pytorch/examples' DDP tutorial series (ddp-tutorial-series/single_gpu.py), the
shape `fix --ddp` turns into the series' multi-GPU script; sized to run in seconds on a CPU."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, DataLoader
from datautils import MyTrainDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        gpu_id: int,
        save_every: int,
    ) -> None:
        self.gpu_id = gpu_id
        self.model = model.to(gpu_id)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.model = DistributedDataParallel(self.model, gradient_as_bucket_view=True)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = self.train_data.batch_size
        if dist.get_rank() == 0:
            print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        for source, targets in self.train_data:
            source = source.to(self.gpu_id)
            targets = targets.to(self.gpu_id)
            self._run_batch(source, targets)

    def _save_checkpoint(self, epoch):
        ckp = self.model.module.state_dict()
        PATH = "checkpoint.pt"
        if dist.get_rank() == 0:
            torch.save(ckp, PATH)
            print(f"Epoch {epoch} | Training checkpoint saved at {PATH}")

    def train(self, max_epochs: int):
        for epoch in range(max_epochs):
            self.train_data.sampler.set_epoch(epoch)
            self._run_epoch(epoch)
            if epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def load_train_objs():
    train_set = MyTrainDataset(64)  # load your dataset
    model = torch.nn.Linear(20, 4)  # load your model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=True,
        sampler=DistributedSampler(dataset, shuffle=True)
    )


def main(device, total_epochs, save_every, batch_size):
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, device, save_every)
    trainer.train(total_epochs)


if __name__ == "__main__":
    # DDP (tcaudit fix --ddp): `torchrun --nproc_per_node=N` starts one process per GPU, each training
    # on batches of the script's batch size; a plain `python` run is a group of one.
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    ddp_backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(ddp_backend)
    else:
        dist.init_process_group(ddp_backend, store=dist.HashStore(), rank=0, world_size=1)
    import argparse
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('total_epochs', type=int, nargs='?', default=1, help='Total epochs to train the model')
    parser.add_argument('save_every', type=int, nargs='?', default=1, help='How often to save a snapshot')
    parser.add_argument('--batch_size', default=8, type=int, help='Input batch size on each device (default: 32)')
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    main(device, args.total_epochs, args.save_every, args.batch_size)
    dist.destroy_process_group()
