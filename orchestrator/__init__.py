"""pairctl: take a llama.cpp fork from an exact revision to an accepted native/RPC GPU pair."""

__version__ = "0.1.0"
