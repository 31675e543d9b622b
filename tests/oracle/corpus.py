"""A small generated corpus of training scripts in the shapes real code has (REALWORLD.md F1-F8).

Ten scripts from one template, choices made by a seeded generator so the corpus is the same on every
machine. Each dimension's options are shuffled once and dealt in turn, so every option of every
dimension appears (F1 AMP/clip behind flags, trainer classes and split forward/backward helpers (F6),
neutral-named loader helpers, lambdas and ``functools.partial`` (F4), device ``0`` / ``"cuda:0"`` /
``torch.device("cuda", 0)`` (F4), a Windows branch (F3), an evaluation model reloaded from a checkpoint
(F5), a seeded ``randperm`` split (F7), a BCE loss in a helper (F2) and a CPU-only script (F8)).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SEED = 20261201
COUNT = 10

DEVICES = {
    "auto": 'device = "cuda" if torch.cuda.is_available() else "cpu"',
    "index0": 'device = 0 if torch.cuda.is_available() else "cpu"',
    "cuda0": 'device = "cuda:0" if torch.cuda.is_available() else "cpu"',
    "object": 'device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")',
    "cpu_only": 'device = "cpu"',
}
STRUCTURES = ("flat", "trainer", "helpers")
AMP = ("none", "flag_clip_after_step", "flag_clip_both", "flag")
LOADERS = ("inline", "build_loader", "lambda", "partial")
MODELS = ("mlp", "convnet")


@dataclass(frozen=True)
class CorpusScript:
    name: str
    text: str
    argv: tuple[str, ...]
    features: tuple[str, ...]


def _deal(rng: random.Random, options, count: int) -> list:
    options = list(options)
    rng.shuffle(options)
    return [options[i % len(options)] for i in range(count)]


def build_corpus(seed: int = SEED, count: int = COUNT) -> list[CorpusScript]:
    rng = random.Random(seed)
    devices = _deal(rng, DEVICES, count)
    structures = _deal(rng, STRUCTURES, count)
    amps = _deal(rng, AMP, count)
    loaders = _deal(rng, LOADERS, count)
    models = _deal(rng, MODELS, count)
    scripts, amp_seen = [], {}
    for i in range(count):
        device, amp = devices[i], amps[i]
        bce = i % 4 == 3  # F2: a BCE loss in a helper, in a script without autocast
        if bce or device == "cpu_only":
            amp = "none"
        features = [device, structures[i], amp, loaders[i], models[i]]
        features += ["bce"] if bce else []
        features += ["windows"] if i % 3 == 0 else []
        features += ["eval_reload"] if i % 2 == 0 else []
        features += ["randperm_split"] if i % 3 == 1 else []
        argv = ["--steps", "4"]
        if amp != "none":
            # each AMP shape runs its AMP branch first, then its plain branch (the scaler is None)
            amp_seen[amp] = amp_seen.get(amp, 0) + 1
            argv += ["--clip", "1.0"] + (["--amp"] if amp_seen[amp] % 2 else [])
        scripts.append(
            CorpusScript(f"gen{i:02d}_{'_'.join(features[:3])}", _render(features, rng), tuple(argv), tuple(features))
        )
    return scripts


def _render(features: list[str], rng: random.Random) -> str:
    device, structure, amp, loader, model = features[:5]
    bce, windows, reload, split = ("bce" in features, "windows" in features, "eval_reload" in features, "randperm_split" in features)
    hidden, lr = rng.choice((16, 32)), rng.choice((0.05, 0.1))
    out_dim = 1 if bce else 4
    lines = ["import argparse", "import functools", "import platform", "", "import torch", "import torch.nn as nn",
             "import torch.nn.functional as F", "from torch.utils.data import DataLoader, TensorDataset", ""]
    if model == "mlp":
        lines += [
            "class Net(nn.Module):",
            "    def __init__(self):",
            "        super().__init__()",
            f"        self.body = nn.Sequential(nn.Linear(12, {hidden}), nn.ReLU(), nn.Linear({hidden}, {hidden}), nn.ReLU())",
            f"        self.head = nn.Linear({hidden}, {out_dim})",
            "",
            "    def forward(self, x):",
            "        return self.head(self.body(x))",
            "",
            "",
            "def make_data(n):",
            "    x = torch.randn(n, 12)",
        ]
    else:
        lines += [
            "class Net(nn.Module):",
            "    def __init__(self):",
            "        super().__init__()",
            f"        self.conv1 = nn.Conv2d(3, {hidden}, 3, padding=1)",
            f"        self.bn1 = nn.BatchNorm2d({hidden})",
            f"        self.conv2 = nn.Conv2d({hidden}, {hidden}, 3, padding=1)",
            f"        self.fc = nn.Linear({hidden}, {out_dim})",
            "",
            "    def forward(self, x):",
            "        x = F.relu(self.bn1(self.conv1(x)))",
            "        x = F.relu(self.conv2(x))",
            "        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))",
            "",
            "",
            "def make_data(n):",
            "    x = torch.randn(n, 3, 8, 8)",
        ]
    if bce:
        lines += ["    y = (x.flatten(1)[:, :1] > 0).float()", "    return x, y", "", ""]
        lines += ["def compute_loss(logits, y):", "    return F.binary_cross_entropy(torch.sigmoid(logits), y)", "", ""]
    else:
        lines += ["    y = (x.flatten(1)[:, :4].argmax(1))", "    return x, y", "", ""]
        lines += ["def compute_loss(logits, y):", "    return F.cross_entropy(logits, y)", "", ""]
    dataset = "TensorDataset(*make_data(64))"
    if split:
        lines += [
            "def split(dataset, val=16):",
            "    perm = torch.randperm(len(dataset))  # the seeded split the results depend on",
            "    return torch.utils.data.Subset(dataset, perm[val:].tolist()), torch.utils.data.Subset(dataset, perm[:val].tolist())",
            "",
            "",
        ]
    if loader == "build_loader":
        lines += ["def build_loader(dataset, batch_size):", "    return DataLoader(dataset, batch_size=batch_size, shuffle=True)", "", ""]
    lines += [
        "def main():",
        "    parser = argparse.ArgumentParser()",
        "    parser.add_argument('--steps', type=int, default=4)",
        "    parser.add_argument('--amp', action='store_true')",
        "    parser.add_argument('--clip', type=float, default=0.0)",
        "    args = parser.parse_args()",
        "    torch.manual_seed(0)",
        f"    {DEVICES[device]}",
        '    device_type = "cuda" if torch.cuda.is_available() else "cpu"' if device != "cpu_only" else '    device_type = "cpu"',
    ]
    if windows:
        lines += [
            '    if platform.system() == "Windows":',
            '        backend = "gloo"  # no NCCL on Windows',
            "    else:",
            '        backend = "nccl" if torch.cuda.is_available() else "gloo"',
            '    print("backend", backend)',
        ]
    lines += [f"    dataset = {dataset}"]
    if split:
        lines += ["    dataset, val_set = split(dataset)"]
    if loader == "inline":
        lines += ["    loader = DataLoader(dataset, batch_size=8, shuffle=True)"]
    elif loader == "build_loader":
        lines += ["    loader = build_loader(dataset, 8)"]
    elif loader == "lambda":
        lines += ["    get_data = lambda ds: DataLoader(ds, batch_size=8, shuffle=True)", "    loader = get_data(dataset)"]
    else:
        lines += ["    make_loader = functools.partial(DataLoader, batch_size=8, shuffle=True)", "    loader = make_loader(dataset)"]
    lines += [
        "    model = Net().to(device)",
        f"    optimizer = torch.optim.SGD(model.parameters(), lr={lr}, momentum=0.9)",
    ]
    if amp != "none":
        lines += ['    scaler = torch.amp.GradScaler(device_type, enabled=device_type == "cuda") if args.amp else None']
    step = _step_code(structure, amp)
    lines += ["    " + line if line else "" for line in step]
    if reload:
        lines += [
            '    torch.save(model.state_dict(), "checkpoint.pt")',
            "    best = Net()",
            '    best.load_state_dict(torch.load("checkpoint.pt"))',
            "    best = best.to(device)",
            "    best.eval()",
            "    with torch.no_grad():",
            "        xv, yv = make_data(16)",
            '        print("eval loss", float(compute_loss(best(xv.to(device)), yv.to(device))))',
        ]
    lines += ["", "", 'if __name__ == "__main__":', "    main()", ""]
    return "\n".join(lines)


def _amp_step(amp: str, loss: str, model: str, optimizer: str, scaler: str, args: str) -> list[str]:
    """The backward/step part of one step in the AMP-behind-a-flag shapes."""
    if amp == "none":
        return [f"{loss}.backward()", f"{optimizer}.step()"]
    if amp == "flag_clip_both":
        return [
            f"if {args}.amp:",
            f"    {scaler}.scale({loss}).backward()",
            f"    if {args}.clip > 0:",
            f"        {scaler}.unscale_({optimizer})",
            f"        torch.nn.utils.clip_grad_norm_({model}.parameters(), {args}.clip)",
            f"    {scaler}.step({optimizer})",
            f"    {scaler}.update()",
            "else:",
            f"    {loss}.backward()",
            f"    if {args}.clip > 0:",
            f"        torch.nn.utils.clip_grad_norm_({model}.parameters(), {args}.clip)",
            f"    {optimizer}.step()",
        ]
    lines = [
        f"if {args}.amp:",
        f"    {scaler}.scale({loss}).backward()",
        f"    {scaler}.step({optimizer})",
        f"    {scaler}.update()",
        "else:",
        f"    {loss}.backward()",
        f"    {optimizer}.step()",
    ]
    if amp == "flag_clip_after_step":  # F1: the clip after the step, in neither branch
        lines += [f"if {args}.clip > 0:", f"    torch.nn.utils.clip_grad_norm_({model}.parameters(), {args}.clip)"]
    return lines


def _autocast(amp: str, args: str) -> str:
    return f'torch.autocast(device_type=device_type, dtype=torch.float16, enabled={args}.amp and device_type == "cuda")'


def _step_code(structure: str, amp: str) -> list[str]:
    forward_lines = ["out = model(x)", "loss = compute_loss(out, y)"]
    if structure == "flat":
        body = ["for step, (x, y) in enumerate(loader):", "    if step >= args.steps:", "        break",
                "    x, y = x.to(device), y.to(device)", "    optimizer.zero_grad()"]
        if amp != "none":
            body += [f"    with {_autocast(amp, 'args')}:"] + ["        " + l for l in forward_lines]
        else:
            body += ["    " + l for l in forward_lines]
        body += ["    " + l for l in _amp_step(amp, "loss", "model", "optimizer", "scaler", "args")]
        body += ['    print("step", step, "loss", float(loss))']
        return body
    if structure == "helpers":  # F6: forward and backward in separate helpers
        fwd = ["def _forward(x, y):"]
        if amp != "none":
            fwd += [f"    with {_autocast(amp, 'args')}:", "        return compute_loss(model(x), y)"]
        else:
            fwd += ["    out = model(x)", "    return compute_loss(out, y)"]
        bwd = ["def _backward(loss):"] + ["    " + l for l in _amp_step(amp, "loss", "model", "optimizer", "scaler", "args")]
        return fwd + [""] + bwd + [
            "",
            "for step, (x, y) in enumerate(loader):",
            "    if step >= args.steps:",
            "        break",
            "    optimizer.zero_grad()",
            "    loss = _forward(x.to(device), y.to(device))",
            "    _backward(loss)",
            '    print("step", step, "loss", float(loss))',
        ]
    # trainer: a class holding model, optimizer and scaler, defined inside main for brevity
    step = ["class Trainer:", "    def __init__(self, model, optimizer, scaler, args):",
            "        self.model, self.optimizer, self.scaler, self.args = model, optimizer, scaler, args", "",
            "    def train_step(self, x, y):", "        self.optimizer.zero_grad()"]
    if amp != "none":
        step += [f"        with {_autocast(amp, 'self.args')}:", "            loss = compute_loss(self.model(x), y)"]
    else:
        step += ["        loss = compute_loss(self.model(x), y)"]
    step += ["        " + l for l in _amp_step(amp, "loss", "self.model", "self.optimizer", "self.scaler", "self.args")]
    step += ["        return loss", ""]
    scaler = "scaler" if amp != "none" else "None"
    return step + [
        f"trainer = Trainer(model, optimizer, {scaler}, args)",
        "for step, (x, y) in enumerate(loader):",
        "    if step >= args.steps:",
        "        break",
        "    loss = trainer.train_step(x.to(device), y.to(device))",
        '    print("step", step, "loss", float(loss))',
    ]


if __name__ == "__main__":  # print the corpus, for reading
    for script in build_corpus():
        print(f"# ==== {script.name} {' '.join(script.argv)}\n{script.text}")
