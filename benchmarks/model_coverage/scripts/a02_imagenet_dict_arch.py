"""The pytorch/examples ImageNet pattern: models.__dict__[args.arch]()."""
import argparse

import torch
import torch.nn as nn
import torchvision.models as models

model_names = sorted(name for name in models.__dict__ if name.islower() and not name.startswith("__")
                     and callable(models.__dict__[name]))

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("data", metavar="DIR", nargs="?", default="imagenet")
parser.add_argument("-a", "--arch", metavar="ARCH", default="resnet18", choices=model_names)
parser.add_argument("-b", "--batch-size", default=256, type=int)
parser.add_argument("--pretrained", dest="pretrained", action="store_true")
parser.add_argument("--gpu", default=None, type=int)


def main():
    args = parser.parse_args()
    if args.pretrained:
        print(f"=> using pre-trained model '{args.arch}'")
        model = models.__dict__[args.arch](pretrained=True)
    else:
        print(f"=> creating model '{args.arch}'")
        model = models.__dict__[args.arch]()
    device = torch.device("cuda")
    model = torch.nn.DataParallel(model).to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)


if __name__ == "__main__":
    main()
