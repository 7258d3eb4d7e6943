"""`python -m fedlight ...`"""
import sys

from fedlight.cli import main

sys.exit(main())
