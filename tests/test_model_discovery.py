"""Model discovery and the static slice, without torch: which constructions are found, which
statements the slice keeps, and why it gives up when it does."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from tcaudit.model import discover_file, parse_input
from tcaudit.model.discovery import ScriptIndex, find_candidates, find_hints
from tcaudit.model.slicing import SliceError, Slicer
from tcaudit.source.parsing import read_source


def index_of(tmp_path: Path, code: str, name: str = "train.py") -> ScriptIndex:
    path = tmp_path / name
    text = textwrap.dedent(code).lstrip("\n")
    path.write_text(text, encoding="utf-8")
    return ScriptIndex(cst.parse_module(text), text, path.resolve())


def labels(index: ScriptIndex) -> list[tuple[str, str]]:
    return [(c.kind, c.label) for c in find_candidates(index)]


def program_text(index: ScriptIndex, which: int = 0) -> str:
    """The slice as readable lines: each item's code, synthetic ones marked."""
    plan = Slicer(index).plan(find_candidates(index)[which])
    out = []

    def walk(items, depth=0):
        for item in items:
            pad = "  " * depth
            if item["t"] in ("stmt", "model"):
                out.append(pad + ("MODEL " if item["t"] == "model" else "") + item["code"].strip())
            elif item["t"] == "synthetic":
                out.append(pad + "SYN " + item["code"].splitlines()[0])
            elif item["t"] == "guard":
                out.append(pad + f"GUARD {item['test']['code']} is {item['expect']}")
            elif item["t"] == "if":
                out.append(pad + f"IF {item['test']['code']}")
                walk(item["body"], depth + 1)
                out.append(pad + "ELSE")
                walk(item["orelse"], depth + 1)
            elif item["t"] == "try":
                out.append(pad + "TRY")
                walk(item["body"], depth + 1)
                for handler in item["handlers"]:
                    out.append(pad + "EXCEPT")
                    walk(handler["body"], depth + 1)

    walk(plan.program)
    return "\n".join(out)


def test_local_module_class_and_wrappers(tmp_path):
    index = index_of(tmp_path, """
        import torch
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.Sequential(Block(), Block())

        model = DDP(Net().to("cuda").half())
    """)
    [candidate] = find_candidates(index)
    assert (candidate.kind, candidate.label) == ("class", "Net()")  # Block() is inside model code
    assert candidate.casts == [".half()"]


def test_later_dtype_casts_of_the_model_variable(tmp_path):
    index = index_of(tmp_path, """
        import torch
        import torch.nn as nn
        model = nn.Sequential(nn.Linear(8, 8))
        model = model.to(device)
        model.to(torch.bfloat16)
    """)
    [candidate] = find_candidates(index)
    assert candidate.kind == "sequential"
    assert candidate.casts == [".to(torch.bfloat16)"]


@pytest.mark.parametrize(
    "code,label",
    [
        ("import torchvision.models as models\nmodel = models.resnet50(num_classes=10)\n",
         "models.resnet50(num_classes=10)"),
        ("import torchvision\nnet = torchvision.models.get_model('resnet18', weights=None)\n",
         "torchvision.models.get_model('resnet18', weights=None)"),
        ("from torchvision import models\nmodel = models.__dict__[args.arch]()\n", "models.__dict__[args.arch]()"),
        ("from torchvision import models\nmodel = getattr(models, 'vgg16')()\n", "getattr(models, 'vgg16')()"),
        ("from torchvision.models import resnet18\nmodel = resnet18()\n", "resnet18()"),
    ],
)
def test_torchvision_factories(tmp_path, code, label):
    assert labels(index_of(tmp_path, code)) == [("torchvision", label)]


def test_not_model_factories(tmp_path):
    index = index_of(tmp_path, """
        import torchvision.models as models
        weights = models.ResNet50_Weights.DEFAULT
        names = models.list_models()
        transform = weights.transforms()
    """)
    assert labels(index) == []


def test_create_model_and_local_factory(tmp_path):
    index = index_of(tmp_path, """
        import timm
        from nets import zoo

        def get_network(args):
            return zoo[args.net]()

        model = timm.create_model("vit_small_patch16_224", pretrained=True)
        net = get_network(args)
    """)
    assert labels(index) == [
        ("create_model", 'timm.create_model("vit_small_patch16_224", pretrained=True)'),
        ("factory", "get_network(args)"),
    ]
    # No optimizer says that get_network() returns a trained model: it is named, not called (issue 46)
    refused = {c.label: c.refused for c in find_candidates(index)}
    assert refused['timm.create_model("vit_small_patch16_224", pretrained=True)'] is None
    assert refused["get_network(args)"].startswith("no optimizer in this file trains what get_network() returns")


def test_class_imported_from_the_users_module(tmp_path):
    (tmp_path / "model.py").write_text(
        "import torch.nn as nn\n\nclass GPT(nn.Module):\n    pass\n\nclass GPTConfig:\n    pass\n", encoding="utf-8"
    )
    index = index_of(tmp_path, """
        from model import GPT, GPTConfig
        config = GPTConfig()
        gpt = GPT(config)
    """)
    assert labels(index) == [("imported", "GPT(config)")]


def test_uncalled_factory_functions_are_not_the_run(tmp_path):
    index = index_of(tmp_path, """
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self, width=64):
                super().__init__()

        def small():
            return Net(32)

        def large():
            return Net(1024)

        if __name__ == "__main__":
            model = Net()
    """)
    assert labels(index) == [("class", "Net()")]


def test_slice_keeps_what_the_model_needs_and_never_the_loop(tmp_path):
    index = index_of(tmp_path, """
        import os
        import torch
        import torch.nn as nn

        WIDTH = 256
        data = torch.load("data.pt")

        class Net(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.fc = nn.Linear(width, width)

        model = Net(WIDTH).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in data:
            opt.step()
    """)
    assert program_text(index) == "\n".join([
        "import torch.nn as nn",
        "WIDTH = 256",
        "class Net(nn.Module):\n"
        "    def __init__(self, width):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(width, width)",
        "MODEL Net(WIDTH)",
    ])


def test_config_dataclass_passed_into_a_training_function(tmp_path):
    index = index_of(tmp_path, """
        from dataclasses import dataclass
        import torch.nn as nn

        @dataclass
        class Config:
            vocab_size: int = 50257

        class LM(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.embed = nn.Embedding(cfg.vocab_size, 64)

        def train(cfg, steps=10):
            model = LM(cfg)
            for _ in range(steps):
                pass

        if __name__ == "__main__":
            train(Config())
    """)
    text = program_text(index)
    assert "SYN def __tcaudit_bind_1(cfg, steps=10):" in text
    assert "SYN globals().update(__tcaudit_bind_1(Config()))" in text
    assert text.index("@dataclass") < text.index("SYN globals()") < text.index("MODEL LM(cfg)")
    assert "for _ in range" not in text and "__main__" not in text


def test_model_args_dict_and_mutation(tmp_path):
    """nanoGPT: model_args = dict(...); model_args['vocab_size'] = ...; GPT(GPTConfig(**model_args))."""
    index = index_of(tmp_path, """
        import os
        import pickle
        import torch.nn as nn

        class GPTConfig:
            def __init__(self, **kw):
                self.__dict__.update(kw)

        class GPT(nn.Module):
            def __init__(self, config):
                super().__init__()

        n_layer = 12
        meta_vocab_size = None
        if os.path.exists("meta.pkl"):
            with open("meta.pkl", "rb") as f:
                meta = pickle.load(f)
            meta_vocab_size = meta["vocab_size"]
        model_args = dict(n_layer=n_layer, vocab_size=None)
        init_from = "scratch"
        if init_from == "scratch":
            model_args["vocab_size"] = meta_vocab_size if meta_vocab_size is not None else 50304
            model = GPT(GPTConfig(**model_args))
    """)
    plan = Slicer(index).plan(find_candidates(index)[0])
    text = program_text(index)
    assert "n_layer = 12" in text and "meta_vocab_size = None" in text
    assert 'model_args["vocab_size"] = ' in text
    assert 'GUARD init_from == "scratch" is True' in text
    assert "pickle.load" not in text  # the statement that unpickles data is left out ...
    assert any("unpickles data" in note and note.endswith("it binds meta") for note in plan.skipped)  # ... and said


def test_argparse_defaults_replace_parse_args(tmp_path):
    index = index_of(tmp_path, """
        import argparse
        import torch.nn as nn

        def get_args():
            p = argparse.ArgumentParser()
            p.add_argument("--width", type=int, default=512)
            p.add_argument("--size", type=int, default="224")
            p.add_argument("--deep", action="store_true")
            return p.parse_args()

        def main():
            args = get_args()
            if args.deep:
                model = nn.Sequential(nn.Linear(args.width, args.width), nn.Linear(args.width, 10))
            else:
                model = nn.Sequential(nn.Linear(args.width, 10))

        main()
    """)
    first = program_text(index, 0)
    assert "SYN args = __tcaudit_namespace__({'deep': (lambda: False), 'size': (lambda: (int)(\"224\")), " \
           "'width': (lambda: 512)})" in first
    assert "GUARD args.deep is True" in first
    assert "GUARD args.deep is False" in program_text(index, 1)


def test_parameter_that_a_framework_provides(tmp_path):
    index = index_of(tmp_path, """
        import hydra
        import torch.nn as nn

        @hydra.main(config_path="conf", config_name="config")
        def main(cfg):
            model = nn.Sequential(nn.Linear(cfg.width, cfg.width))

        if __name__ == "__main__":
            main()
    """)
    with pytest.raises(SliceError, match=r"built inside main\(\) from cfg, which the call at line 9 does not pass"):
        Slicer(index).plan(find_candidates(index)[0])


def test_method_of_a_trainer_class(tmp_path):
    index = index_of(tmp_path, """
        import torch.nn as nn

        class Trainer:
            def __init__(self, cfg):
                self.cfg = cfg
                self.loader = make_loader(cfg)
                self.model = nn.Sequential(nn.Linear(self.cfg["width"], 8))

        trainer = Trainer({"width": 16})
    """)
    text = program_text(index)
    assert "self.cfg = cfg" in text and "make_loader" not in text
    assert "SYN globals().update(__tcaudit_bind_1(__tcaudit_self__(), {\"width\": 16}))" in text


def test_registry_decorators_are_kept(tmp_path):
    index = index_of(tmp_path, """
        import torch.nn as nn
        _REGISTRY = {}

        def register(fn):
            _REGISTRY[fn.__name__] = fn
            return fn

        def create_model(name):
            return _REGISTRY[name]()

        @register
        def tiny():
            return nn.Linear(8, 8)

        model = create_model("tiny")
    """)
    text = program_text(index)
    assert "@register\ndef tiny():" in text and "_REGISTRY = {}" in text


def test_missing_package_is_a_static_failure(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import not_a_real_package_xyz as zoo\nmodel = zoo.create_model('a')\n", encoding="utf-8")
    [(target, failure, _)] = discover_file(read_source(path))
    assert failure.startswith("it needs not_a_real_package_xyz, which is not installed here")
    assert target["construction"]["line"] == 2


def test_hints(tmp_path):
    index = index_of(tmp_path, """
        import argparse
        import torch
        import torchvision.transforms as T
        from torch.utils.data import DataLoader
        from torchvision import datasets

        parser = argparse.ArgumentParser()
        parser.add_argument("--batch-size", type=int, default=48)
        parser.add_argument("--img-size", type=int, default=192)
        args = parser.parse_args()
        train = datasets.CIFAR100("data", transform=T.Compose([T.RandomResizedCrop(args.img_size)]))
        loader = DataLoader(train, batch_size=args.batch_size)
        x = torch.randint(0, 100, (4, 77))
    """)
    hints = find_hints(index)
    assert hints["batch_size"] == 48 and "DataLoader" in hints["batch_origin"]
    assert hints["image_size"] == 192 and "RandomResizedCrop" in hints["image_origin"]
    assert hints["channels"] == 3
    assert hints["seq_len"] == 77


def test_parse_input():
    assert parse_input("8x3x224x224") == [[8, 3, 224, 224]]
    assert parse_input("8x1024, 8x1024") == [[8, 1024], [8, 1024]]
    with pytest.raises(ValueError):
        parse_input("8 by 3")


def test_models_the_audit_cannot_build_offline_are_named(tmp_path):
    path = tmp_path / "finetune.py"
    path.write_text(textwrap.dedent("""
        import torch
        from diffusers import UNet2DModel

        model = UNet2DModel.from_pretrained("google/ddpm-cat-256")
        teacher = torch.load("teacher.pt")
    """).lstrip(), encoding="utf-8")
    found = discover_file(read_source(path))
    assert [(t["construction"]["line"], f.split(",")[0]) for t, f, _ in found] == [
        (4, "it is loaded with from_pretrained()"),
        (5, "it is unpickled from a file with torch.load()"),
    ]
    # transformers' from_pretrained is built from a config instead (tests/test_model_reach.py)


def test_a_third_party_model_class(tmp_path):
    index = index_of(tmp_path, """
        from mamba_ssm import Mamba, MambaConfig
        from transformers import Trainer

        config = MambaConfig(d_model=512)
        model = Mamba(config)
        trainer = Trainer(model=model)
    """)
    assert labels(index) == [("external", "Mamba(config)")]
