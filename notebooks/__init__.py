"""The tutorial notebooks. A package only so that pytest imports notebooks/conftest.py as notebooks.conftest."""
