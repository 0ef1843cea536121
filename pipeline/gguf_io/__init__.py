"""The GGUF file: its reader, dequantizers, tokenizer and the registry of models we fetch."""
