"""Nested config dict read with .get and a default."""
import torch
import torch.nn as nn

cfg = {
    "model": {"name": "unet", "channels": [32, 64, 128], "in_ch": 1, "out_ch": 2},
    "data": {"batch_size": 8, "image_size": 128},
}


class DoubleConv(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


class TinyUNet(nn.Module):
    def __init__(self, in_ch, out_ch, channels):
        super().__init__()
        c1, c2, c3 = channels
        self.d1, self.d2, self.mid = DoubleConv(in_ch, c1), DoubleConv(c1, c2), DoubleConv(c2, c3)
        self.u2 = nn.ConvTranspose2d(c3, c2, 2, stride=2)
        self.c2 = DoubleConv(2 * c2, c2)
        self.u1 = nn.ConvTranspose2d(c2, c1, 2, stride=2)
        self.c1 = DoubleConv(2 * c1, c1)
        self.out = nn.Conv2d(c1, out_ch, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(nn.functional.max_pool2d(a, 2))
        m = self.mid(nn.functional.max_pool2d(b, 2))
        b = self.c2(torch.cat([self.u2(m), b], 1))
        return self.out(self.c1(torch.cat([self.u1(b), a], 1)))


def build(cfg):
    mcfg = cfg.get("model", {})
    return TinyUNet(mcfg.get("in_ch", 3), mcfg.get("out_ch", 1), mcfg["channels"])


model = build(cfg).cuda()
opt = torch.optim.Adam(model.parameters())
