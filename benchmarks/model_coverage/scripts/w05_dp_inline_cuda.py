"""nn.DataParallel(Model()).cuda() in one line, inside a Trainer class."""
import torch
import torch.nn as nn


class Generator(nn.Module):
    def __init__(self, nz=100, ngf=64, nc=3):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 8), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, nc, 4, 2, 1, bias=False), nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Trainer:
    def __init__(self, nz=100):
        self.nz = nz
        self.netG = nn.DataParallel(Generator(nz)).cuda()
        self.opt = torch.optim.Adam(self.netG.parameters(), lr=2e-4)

    def step(self):
        z = torch.randn(64, self.nz, 1, 1).cuda()
        self.netG(z).mean().backward()
        self.opt.step()


if __name__ == "__main__":
    Trainer().step()
