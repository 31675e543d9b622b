import torch.nn as nn
import torch.nn.functional as F

from .blocks import PreActBlock


class PreActNet(nn.Module):
    def __init__(self, layers, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        blocks, cin = [], 64
        for i, n in enumerate(layers):
            cout = 64 * 2 ** i
            for j in range(n):
                blocks.append(PreActBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(cin)
        self.linear = nn.Linear(cin, num_classes)

    def forward(self, x):
        out = F.relu(self.bn(self.layers(self.conv1(x))))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))
