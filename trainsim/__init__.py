"""trainsim command-line front door (``trainsim --help``)."""

__version__ = "0.1.0"
