"""Training code of mtp-explorer's bundled demo model (optional extra ``train``: torch, transformers, tokenizers).

``python -m training.train`` reproduces ``mtp_explorer/models/pystdlib-qwen35-mtp.gguf``
from scratch; see ``training/README.md``.
"""
