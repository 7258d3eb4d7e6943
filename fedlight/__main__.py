"""`python -m fedlight ...`"""
import sys

from fedlight.run.cli import main

sys.exit(main())
