"""Development tools, not part of the runtime API: the llama.cpp reference harness (parity checks), the
GGUF writers that make the bundled model and the SYNTHETIC test and benchmark models, and quantized copies
made with llama.cpp's llama-quantize (:mod:`.quantize`)."""
