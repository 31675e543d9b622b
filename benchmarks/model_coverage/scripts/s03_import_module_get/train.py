"""import networks; networks.get_network(args.net) with a dict inside the module."""
import argparse

import torch

import networks


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--net", default="vgg11")
    parser.add_argument("--batch-size", type=int, default=64)
    return parser.parse_args()


def main():
    args = parse()
    net = networks.get_network(args.net)
    net = net.cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)


if __name__ == "__main__":
    main()
