"""A helper that takes args builds the network."""
import argparse

import torch
import torch.nn as nn


class LSTMTagger(nn.Module):
    def __init__(self, vocab, embed, hidden, tags):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, tags)

    def forward(self, x):
        h, _ = self.lstm(self.embed(x))
        return self.out(h)


def create_network(args):
    net = LSTMTagger(args.vocab, args.embed, args.hidden, args.tags)
    if args.init == "xavier":
        for p in net.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
    return net


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=10000)
    parser.add_argument("--embed", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=200)
    parser.add_argument("--tags", type=int, default=17)
    parser.add_argument("--init", default="xavier")
    parser.add_argument("--seq-len", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    net = create_network(args).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
