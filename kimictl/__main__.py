import sys

from kimictl.cli import main

sys.exit(main())
