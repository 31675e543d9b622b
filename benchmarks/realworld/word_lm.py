"""Word-level language model in the shape of pytorch/examples/word_language_model (our own code):
LSTM or Transformer, batchify, bptt, clip_grad_norm_, a learning rate annealed by hand. A synthetic
corpus with WikiText-2's vocabulary size stands in for the text files.

    python word_lm.py --model LSTM --emsize 650 --nhid 650 --batch-size 64 --steps 100
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="PyTorch Wikitext-2 RNN/LSTM/GRU/Transformer Language Model")
parser.add_argument("--model", type=str, default="LSTM", help="type of network (RNN_TANH, RNN_RELU, LSTM, GRU, Transformer)")
parser.add_argument("--emsize", type=int, default=200)
parser.add_argument("--nhid", type=int, default=200)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--lr", type=float, default=20)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--steps", type=int, default=0, help="stop after this many batches (0: all)")
parser.add_argument("--batch-size", type=int, default=20, metavar="N")
parser.add_argument("--bptt", type=int, default=35)
parser.add_argument("--dropout", type=float, default=0.2)
parser.add_argument("--nhead", type=int, default=2)
parser.add_argument("--ntokens", type=int, default=33278, help="vocabulary size of the synthetic corpus (WikiText-2's)")
parser.add_argument("--corpus-tokens", type=int, default=2_088_628)
parser.add_argument("--log-interval", type=int, default=200)
parser.add_argument("--cuda", action="store_true", default=torch.cuda.is_available())
args = parser.parse_args()

torch.manual_seed(1111)
device = torch.device("cuda" if args.cuda else "cpu")


class RNNModel(nn.Module):
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.decoder.out_features)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0), :])


class TransformerModel(nn.Transformer):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers)
        self.decoder = None  # the encoder stack alone, as the example does
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.lm_head = nn.Linear(ninp, ntoken)
        nn.init.uniform_(self.input_emb.weight, -0.1, 0.1)
        nn.init.zeros_(self.lm_head.bias)
        nn.init.uniform_(self.lm_head.weight, -0.1, 0.1)

    def forward(self, src, has_mask=True):
        if has_mask:
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                self.src_mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src.device)
        else:
            self.src_mask = None
        src = self.pos_encoder(self.input_emb(src) * math.sqrt(self.ninp))
        output = self.lm_head(self.encoder(src, mask=self.src_mask))
        return F.log_softmax(output, dim=-1)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


corpus = torch.randint(0, args.ntokens, (args.corpus_tokens,), generator=torch.Generator().manual_seed(0))
train_data = batchify(corpus, args.batch_size)
ntokens = args.ntokens
if args.model == "Transformer":
    model = TransformerModel(ntokens, args.emsize, args.nhead, args.nhid, args.nlayers, args.dropout).to(device)
else:
    model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout).to(device)
criterion = nn.NLLLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)


def train(epoch, step):
    model.train()
    total_loss, epoch_loss, batches = 0.0, 0.0, 0
    start_time = time.time()
    if args.model != "Transformer":
        hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        if args.model == "Transformer":
            output = model(data).view(-1, ntokens)
        else:
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        total_loss += loss.item()
        epoch_loss += loss.item()
        batches += 1
        print(f"| epoch {epoch:3d} | batch {batch:5d} | loss {loss.item():5.2f}")
        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            elapsed = time.time() - start_time
            print(f"| {elapsed * 1000 / args.log_interval:5.2f} ms/batch | ppl {math.exp(min(cur_loss, 50)):8.2f}")
            total_loss, start_time = 0.0, time.time()
        step += 1
        if args.steps and step >= args.steps:
            break
    return step, epoch_loss / max(batches, 1)


lr = args.lr
best_loss = None
step = 0
for epoch in range(1, args.epochs + 1):
    step, val_loss = train(epoch, step)  # no held-out text here: the epoch's training loss stands in
    if args.steps and step >= args.steps:
        break
    if best_loss is None or val_loss < best_loss:
        best_loss = val_loss
    else:
        lr /= 4.0
        for group in optimizer.param_groups:
            group["lr"] = lr
