"""Fine-tuning a causal LM from the hub: AutoModelForCausalLM.from_pretrained(args.model_name)."""
import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-name", default="gpt2")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=512)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model_name)
    model = AutoModelForCausalLM.from_pretrained(args.model_name)
    model.to(torch.device("cuda"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)


if __name__ == "__main__":
    main()
