"""BERT fine-tuning for 3 labels; num_labels goes to the config."""
import torch
from transformers import BertForSequenceClassification

device = "cuda"
model = BertForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=3)
model.to(device)
max_len = 128
batch_size = 32
