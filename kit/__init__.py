"""Reproduction kit for sglang PR #29654 (DSA indexer reuse across EAGLE/MTP draft steps)."""

__version__ = "0.1.0"
