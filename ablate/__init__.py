"""ablate: controlled, matched ablations of attention mechanisms in small language models."""

__version__ = "0.1.0"
