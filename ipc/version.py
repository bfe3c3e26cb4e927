"""zeroclaw's version: the one value every package may import (``setup.cfg`` reads it)."""

__version__ = "0.1.0"
