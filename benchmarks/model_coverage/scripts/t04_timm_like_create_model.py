"""A timm-style local registry with create_model(name, pretrained=True)."""
import torch
import torch.nn as nn

_model_entrypoints = {}


def register_model(fn):
    _model_entrypoints[fn.__name__] = fn
    return fn


class Mixer(nn.Module):
    def __init__(self, dim, depth, patch=16, classes=1000, tokens=196):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)) for _ in range(depth)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x.mean(1))


@register_model
def mixer_s16(pretrained=False, **kwargs):
    model = Mixer(512, 2, **kwargs)
    if pretrained:
        model.load_state_dict(torch.hub.load_state_dict_from_url("https://example.com/mixer_s16.pth"))
    return model


def create_model(name, pretrained=False, **kwargs):
    return _model_entrypoints[name](pretrained=pretrained, **kwargs)


model = create_model("mixer_s16", pretrained=True, classes=100)
model.cuda()
optimizer = torch.optim.AdamW(model.parameters())
