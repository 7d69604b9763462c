"""Command-line tools for the GPU training job API (``gpujobs``)."""
