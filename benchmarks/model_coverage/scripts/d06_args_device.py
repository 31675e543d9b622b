"""--device flag (default cuda), model.to(args.device)."""
import argparse

import torch
import torch.nn as nn


class TextCNN(nn.Module):
    def __init__(self, vocab, dim, filters, classes):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.convs = nn.ModuleList([nn.Conv1d(dim, filters, k) for k in (3, 4, 5)])
        self.fc = nn.Linear(3 * filters, classes)

    def forward(self, x):
        e = self.embed(x).transpose(1, 2)
        pooled = [c(e).relu().amax(dim=2) for c in self.convs]
        return self.fc(torch.cat(pooled, 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--vocab-size", type=int, default=20001)
    parser.add_argument("--embed-dim", type=int, default=300)
    parser.add_argument("--filters", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    model = TextCNN(args.vocab_size, args.embed_dim, args.filters, 2).to(args.device)
    opt = torch.optim.Adadelta(model.parameters())
    for _ in range(10):
        x = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), device=args.device)
        loss = model(x).logsumexp(1).mean()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
