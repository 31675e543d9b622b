"""if/elif on an --arch flag; the default choice is what runs."""
import argparse

import torch
import torch.nn as nn


class RNNModel(nn.Module):
    def __init__(self, kind, ntoken, ninp, nhid, nlayers):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, kind)(ninp, nhid, nlayers, batch_first=True)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x):
        return self.decoder(self.rnn(self.encoder(x))[0])


class TransformerModel(nn.Module):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(ninp, nhead, nhid, batch_first=True), nlayers)
        self.decoder = nn.Linear(ninp, ntoken)

    def forward(self, x):
        return self.decoder(self.body(self.encoder(x)))


parser = argparse.ArgumentParser()
parser.add_argument("--model", type=str, default="LSTM")
parser.add_argument("--emsize", type=int, default=200)
parser.add_argument("--nhid", type=int, default=200)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--bptt", type=int, default=35)
parser.add_argument("--batch_size", type=int, default=20)
args = parser.parse_args()
ntokens = 33278
device = torch.device("cuda")

if args.model == "Transformer":
    model = TransformerModel(ntokens, args.emsize, 2, args.nhid, args.nlayers).to(device)
elif args.model in ("LSTM", "GRU"):
    model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers).to(device)
else:
    raise ValueError(args.model)
