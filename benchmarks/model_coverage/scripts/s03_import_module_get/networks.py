import torch.nn as nn

CFG = {"vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M"], "vgg8": [64, "M", 128, "M", 256, "M"]}


class VGG(nn.Module):
    def __init__(self, cfg, num_classes=100):
        super().__init__()
        layers, cin = [], 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                cin = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


def get_network(name):
    return VGG(CFG[name])
