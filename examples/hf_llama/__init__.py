"""A Hugging Face Llama trained with the kit: train.py."""
