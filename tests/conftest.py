"""Test configuration: make ``tests.builders`` importable as ``builders``."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
