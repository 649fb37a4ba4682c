import sys

from lit_ascent.warmstart.cli import main

sys.exit(main())
