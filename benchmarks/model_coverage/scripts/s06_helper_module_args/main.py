"""The model is built by utils.setup_model(args) in a sibling module that imports another sibling."""
import argparse

import torch

from utils import setup_model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=512)
    args = parser.parse_args()
    model = setup_model(args)
    model.to(torch.device("cuda"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


if __name__ == "__main__":
    main()
