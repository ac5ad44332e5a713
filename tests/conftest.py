import os
import sys

# tests import the shared NumPy reference as `reference`
sys.path.insert(0, os.path.dirname(__file__))
