"""A GAN: generator and discriminator, both moved to the device."""
import torch
import torch.nn as nn

latent_dim = 100
img_shape = (1, 28, 28)
cuda = torch.cuda.is_available()
device = torch.device("cuda")


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(latent_dim, 128), nn.LeakyReLU(0.2), nn.Linear(128, 256), nn.LeakyReLU(0.2),
                                   nn.Linear(256, 784), nn.Tanh())

    def forward(self, z):
        return self.model(z).view(z.size(0), *img_shape)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(784, 512), nn.LeakyReLU(0.2), nn.Linear(512, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1))

    def forward(self, img):
        return self.model(img.flatten(1))


generator = Generator().to(device)
discriminator = Discriminator().to(device)
batch_size = 64
