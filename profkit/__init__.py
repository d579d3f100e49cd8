"""profkit: which optimization bought which microseconds, and did it do anything else?"""

__version__ = "0.1.0"
