# Everything is in setup.cfg; this shim lets `pip install -e .` work with any pip.
from setuptools import setup

setup()
