"""word_lm.py as an expert would write it: the same model, corpus and loss, with bf16 autocast, TF32,
the decoder's output padded to a multiple of 64 (the padding is sliced off before log_softmax, so the
loss is the same function), a fused SGD, torch.compile, and the loss read only when it prints.

    python word_lm_ceiling.py --model LSTM --emsize 650 --nhid 650 --batch-size 64 --steps 100
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="word language model (tuned)")
parser.add_argument("--model", type=str, default="LSTM")
parser.add_argument("--emsize", type=int, default=200)
parser.add_argument("--nhid", type=int, default=200)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--lr", type=float, default=20)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--steps", type=int, default=0)
parser.add_argument("--batch-size", type=int, default=20)
parser.add_argument("--bptt", type=int, default=35)
parser.add_argument("--dropout", type=float, default=0.2)
parser.add_argument("--nhead", type=int, default=2)
parser.add_argument("--ntokens", type=int, default=33278)
parser.add_argument("--corpus-tokens", type=int, default=2_088_628)
parser.add_argument("--log-interval", type=int, default=200)
parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the model (default: on with CUDA)")
args = parser.parse_args()

torch.manual_seed(1111)
cuda = torch.cuda.is_available()
device = torch.device("cuda" if cuda else "cpu")
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.backends.cudnn.benchmark = True


def padded(n, multiple=64):
    return (n + multiple - 1) // multiple * multiple


class RNNModel(nn.Module):
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, padded(ntoken))
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output))[..., :self.ntoken].reshape(-1, self.ntoken)
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
        self.decoder = None
        self.ntoken = ntoken
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.lm_head = nn.Linear(ninp, padded(ntoken))
        nn.init.uniform_(self.input_emb.weight, -0.1, 0.1)
        nn.init.zeros_(self.lm_head.bias)
        nn.init.uniform_(self.lm_head.weight, -0.1, 0.1)

    def forward(self, src):
        mask = nn.Transformer.generate_square_subsequent_mask(len(src), device=src.device)
        src = self.pos_encoder(self.input_emb(src) * math.sqrt(self.ninp))
        output = self.lm_head(self.encoder(src, mask=mask, is_causal=True))[..., :self.ntoken]
        return F.log_softmax(output, dim=-1)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


corpus = torch.randint(0, args.ntokens, (args.corpus_tokens,), generator=torch.Generator().manual_seed(0))
train_data = batchify(corpus, args.batch_size)
ntokens = args.ntokens
if args.model == "Transformer":
    model = TransformerModel(ntokens, args.emsize, args.nhead, args.nhid, args.nlayers, args.dropout).to(device)
else:
    model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout).to(device)
criterion = nn.NLLLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, fused=cuda)
train_model = torch.compile(model) if (cuda if args.compile is None else args.compile) else model


def train(epoch, step):
    model.train()
    total_loss = torch.zeros((), device=device)
    batches = 0
    if args.model != "Transformer":
        hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        if data.size(0) != args.bptt:  # a short last batch would recompile the model for one step
            break
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            if args.model == "Transformer":
                output = train_model(data).view(-1, ntokens)
            else:
                hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()
                output, hidden = train_model(data, hidden)
            loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        total_loss += loss.detach()
        batches += 1
        if batch % args.log_interval == 0:
            print(f"| epoch {epoch:3d} | batch {batch:5d} | loss {loss.item():5.2f}")
        step += 1
        if args.steps and step >= args.steps:
            break
    return step, total_loss.item() / max(batches, 1)


lr = args.lr
best_loss = None
step = 0
for epoch in range(1, args.epochs + 1):
    step, val_loss = train(epoch, step)
    if args.steps and step >= args.steps:
        break
    if best_loss is None or val_loss < best_loss:
        best_loss = val_loss
    else:
        lr /= 4.0
        for group in optimizer.param_groups:
            group["lr"] = lr
