"""Development tools, not part of the runtime API and not in the wheel: the llama.cpp reference harness (parity
checks), the Hugging Face exporters and converters, and quantized copies made with llama.cpp's llama-quantize
(:mod:`.quantize`). The GGUF writers and the SYNTHETIC models are in :mod:`mtp_explorer.models`."""
