"""A Hugging Face Trainer pretraining a GPT-2-small-sized model built from its config on synthetic tokens:
the shape of the notebooks, tuned by hand: bf16, TF32 and the vocabulary padded to 50,304. `tcaudit verify`
runs it on the device (BENCHMARKS.md, "Frameworks that own the loop"); the harness stops it after its timed
steps."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=4096, length=512, vocab=50304):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


if __name__ == "__main__":
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50304))
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, max_steps=10_000, logging_steps=50,
                             save_strategy="no", report_to="none", dataloader_num_workers=4, bf16=True,
                             tf32=True)
    Trainer(model=model, args=args, train_dataset=Tokens()).train()
