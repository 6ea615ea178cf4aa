"""`python -m gemref`: the gemref command (gemref/cli.py)."""
import sys

from .cli import main

sys.exit(main())
