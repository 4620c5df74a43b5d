"""The package's version: trainerd's own (CMake's PROJECT_VERSION), whose API it speaks."""

__version__ = "0.1.0"
