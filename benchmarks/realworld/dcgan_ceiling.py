"""dcgan.py as an expert would write it: the same networks, data and losses, with D returning logits
and BCEWithLogitsLoss (the same loss as Sigmoid + BCELoss, and safe under autocast, where BCELoss
raises), bf16 autocast, channels_last (the noise too: see the loop), cudnn.benchmark, fused Adam,
torch.compile of both networks, uint8 batches in pinned memory copied without blocking, and the host
reading values only when it prints.

    python dcgan_ceiling.py --batch-size 128 --steps 100
"""
import argparse

import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--imageSize", type=int, default=64)
parser.add_argument("--nz", type=int, default=100)
parser.add_argument("--ngf", type=int, default=64)
parser.add_argument("--ndf", type=int, default=64)
parser.add_argument("--niter", type=int, default=25)
parser.add_argument("--steps", type=int, default=0)
parser.add_argument("--lr", type=float, default=0.0002)
parser.add_argument("--beta1", type=float, default=0.5)
parser.add_argument("--dataset-size", type=int, default=202599)
parser.add_argument("--log-interval", type=int, default=50)
parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile both networks (default: on with CUDA)")
opt = parser.parse_args()

cuda = torch.cuda.is_available()
device = torch.device("cuda:0" if cuda else "cpu")
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
nz, ngf, ndf, nc = opt.nz, opt.ngf, opt.ndf, 3
channels_last = torch.channels_last


class RandomImagesUint8(torch.utils.data.Dataset):
    def __init__(self, size, image_size, distinct=256):
        self.size = size
        self.images = torch.randint(0, 256, (distinct, nc, image_size, image_size), dtype=torch.uint8,
                                    generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.images[index % len(self.images)], 0


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 8), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    """dcgan.py's discriminator without the final Sigmoid: it returns logits."""

    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 8), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


dataset = RandomImagesUint8(opt.dataset_size, opt.imageSize)
dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batch_size, shuffle=True, num_workers=opt.workers,
                                         pin_memory=cuda, persistent_workers=opt.workers > 0)
netG = Generator().to(device)
netG.apply(weights_init)
netD = Discriminator().to(device)
netD.apply(weights_init)
netG, netD = netG.to(memory_format=channels_last), netD.to(memory_format=channels_last)
criterion = nn.BCEWithLogitsLoss()
fixed_noise = torch.randn(opt.batch_size, nz, 1, 1, device=device)
real_label, fake_label = 1.0, 0.0
optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999), fused=cuda)
optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999), fused=cuda)
if cuda if opt.compile is None else opt.compile:
    trainD, trainG = torch.compile(netD), torch.compile(netG)
else:
    trainD, trainG = netD, netG
autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

step = 0
for epoch in range(opt.niter):
    for i, data in enumerate(dataloader, 0):
        netD.zero_grad(set_to_none=True)
        real = data[0].to(device, non_blocking=True).float().div_(127.5).sub_(1.0)
        real = real.contiguous(memory_format=channels_last)
        batch_size = real.size(0)
        label = torch.full((batch_size,), real_label, device=device)
        with autocast:
            output = trainD(real)
            errD_real = criterion(output, label)
        errD_real.backward()

        # Copied into channels_last strides: (b, nz, 1, 1) in NCHW is also "channels_last-contiguous", so
        # .contiguous(memory_format=...) would keep its NCHW strides, cuDNN would then compute the
        # generator's first weight gradient in NCHW, and inductor (expecting the channels_last weight's
        # layout) fails a stride assertion in convolution_backward (torch 2.11, H200).
        noise = torch.randn(batch_size, nz, 1, 1, device=device).to(memory_format=channels_last)
        with autocast:
            fake = trainG(noise)
            label.fill_(fake_label)
            output = trainD(fake.detach())
            errD_fake = criterion(output, label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()

        netG.zero_grad(set_to_none=True)
        label.fill_(real_label)
        with autocast:
            output = trainD(fake)
            errG = criterion(output, label)
        errG.backward()
        optimizerG.step()

        if i % opt.log_interval == 0:
            print("[%d/%d][%d/%d] loss %.4f Loss_G: %.4f D(G(z)): %.4f"
                  % (epoch, opt.niter, i, len(dataloader), errD.item(), errG.item(), torch.sigmoid(output).mean().item()))
        step += 1
        if opt.steps and step >= opt.steps:
            break
    if opt.steps and step >= opt.steps:
        break
