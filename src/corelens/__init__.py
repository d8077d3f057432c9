"""corelens: find, test and exploit the attention heads of multimodal LLMs that retrieve visual evidence."""

__version__ = "0.1.0"
