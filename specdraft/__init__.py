"""specdraft: lossless speculative decoding with pluggable drafters."""

__version__ = "0.1.0"
