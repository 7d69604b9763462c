"""``python -m cli.gpujobs``: the ``gpujobs`` console script without installing."""

import sys

from cli.gpujobs.command_line import main

sys.exit(main())
