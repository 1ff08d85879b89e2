"""Edges to other formats: Hugging Face checkpoints, torch.nn.Transformer state dicts, tokenizers."""
